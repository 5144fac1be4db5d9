# The addon does not link libdlock (it dlopen()s it: see src/dlock_node.cc);
# pkg-config only gives dlock.h's directory, the same library the loader
# then finds through build/libdlock.json (scripts/install.js).
{
  "targets": [
    {
      "target_name": "dlock",
      "sources": ["src/dlock_node.cc"],
      "include_dirs": [
        "<!(node -p \"require('node-addon-api').include_dir\")"
      ],
      "cflags": ["<!@(pkg-config --cflags-only-I dlock)"],
      "cflags_cc": ["-std=c++17", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions", "-std=gnu++17"],
      "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS", "NODE_ADDON_API_DISABLE_DEPRECATED"],
      "libraries": ["-ldl", "-pthread"]
    }
  ]
}
