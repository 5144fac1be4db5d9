"""The package installs with pip (offline, no build isolation) into a venv
and is imported from there."""

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_install_in_venv(tmp_path):
    try:
        import venv  # noqa: F401
        import setuptools  # noqa: F401
    except ImportError as e:
        pytest.fail("{} (Debian: python3-venv python3-setuptools)".format(e))
    # A copy, so that pip's build leaves nothing in the source tree.
    src = tmp_path / "src"
    shutil.copytree(HERE, src, ignore=shutil.ignore_patterns(
        "__pycache__", "build", "*.egg-info", ".pytest_cache"))
    venv_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv_dir)],
                   check=True, timeout=120)
    py = str(venv_dir / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_NO_INDEX"] = "1"
    r = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                        "--disable-pip-version-check", str(src)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = ("import dlock, sys\n"
            "assert sys.prefix != sys.base_prefix\n"
            "print(dlock.__file__)\n"
            "c = dlock.open('file://' + sys.argv[1])\n"
            "with c.lock('x', ttl=5) as l: print(l.token > 0)\n"
            "c.close()\n")
    r = subprocess.run([py, "-c", code, str(tmp_path / "locks")], cwd=str(elsewhere), env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    where, ok = r.stdout.split()
    assert where.startswith(str(venv_dir)), where
    assert ok == "True"
