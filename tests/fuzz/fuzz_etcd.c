/*
 * libFuzzer target: what the etcd backend reads from a server
 * (backends/etcd_reply.c, etcd_json.c): the watch stream, one JSON object
 * per line, fed in pieces of varying size as HTTP chunks arrive; the keys
 * of a range reply; base64 and int64 fields.
 *
 * The whole input is the stream; it is also parsed as one JSON reply,
 * whose "kvs" (or itself) is read as keys. Pure functions: no connection.
 * Checks, beyond the sanitizers: a stream not ended holds no whole line;
 * an ended one says why (a DELETE, or a reason); a key read is
 * NUL-terminated at its length, its value fits.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd_json.h"
#include "backends/etcd_reply.h"

#define require(cond)                                                                  \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "fuzz_etcd: %s:%d: broken: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                   \
        }                                                                              \
    } while (0)

static void read_keys(json_object *kvs)
{
    size_t n = json_object_is_type(kvs, json_type_array) ? json_object_array_length(kvs) : 1;
    for (size_t i = 0; i < n && i < 64; i++) {
        json_object *o = json_object_is_type(kvs, json_type_array)
                             ? json_object_array_get_idx(kvs, i) : kvs;
        struct etcd_kv kv;
        if (etcd_kv_read(o, &kv) == 0) {
            require(kv.key != NULL && kv.key[kv.klen] == '\0');
            require(strlen(kv.value) < sizeof kv.value);
            free(kv.key);
        } else {
            require(kv.key == NULL);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct etcd_stream w = {0};
    size_t piece = size ? (size_t)data[0] % 7 + 1 : 1;
    for (size_t at = 0; at < size && !w.done; at += piece) {
        size_t n = size - at < piece ? size - at : piece;
        require(etcd_stream_feed(&w, (const char *)data + at, n) == n);
    }
    require(w.done >= 0 && w.done <= 2);
    if (!w.done)
        require(w.len == 0 || memchr(w.buf, '\n', w.len) == NULL);
    if (w.done == 2)
        require(w.why[0] != '\0');
    etcd_stream_free(&w);

    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    json_object *root = json_tokener_parse(text);
    if (root) {
        json_object *kvs = etcd_get(root, "kvs");
        read_keys(kvs ? kvs : root);
        (void)etcd_int(root, "revision");
        (void)etcd_int(etcd_get(root, "header"), "revision");
        unsigned char out[64];
        size_t len = sizeof out;
        if (etcd_bytes(etcd_get(root, "key"), out, &len) == 0)
            require(len <= sizeof out);
        json_object_put(root);
    }
    free(text);
    return 0;
}
