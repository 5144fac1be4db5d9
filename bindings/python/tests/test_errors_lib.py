"""Exceptions from the error table; loading the library; the struct layout."""

import ctypes
import os
import pickle
import subprocess
import sys

import pytest

import dlock
from dlock import _lib


def test_every_code_has_a_class():
    n = 0
    code = -1
    while _lib.lib.dlock_err_name(code) != b"DLOCK_UNKNOWN":
        cls = dlock.error_class(code)
        name = _lib.lib.dlock_err_name(code).decode()
        assert cls.__name__ == name[len("DLOCK_"):]
        assert getattr(dlock, cls.__name__) is cls
        assert dlock.error_class(name) is cls
        assert issubclass(cls, dlock.DlockError)
        e = cls(code)
        assert e.code == name and e.errno == code
        assert e.message == _lib.lib.dlock_strerror(code).decode()
        n += 1
        code -= 1
    assert n >= 22  # up to DLOCK_ECANCELED at least
    assert dlock.error_class(-1000) is dlock.DlockError


def test_builtin_bases():
    assert issubclass(dlock.ETIMEDOUT, TimeoutError)
    assert issubclass(dlock.EINVAL, ValueError)
    assert issubclass(dlock.EBADURI, ValueError)
    assert issubclass(dlock.ECONNECT, ConnectionError)
    assert issubclass(dlock.ENOMEM, MemoryError)
    assert not issubclass(dlock.EBUSY, OSError)


def test_exception_carries_code_errno_message(tmp_path):
    a = dlock.open("file://" + str(tmp_path))
    b = dlock.open("file://" + str(tmp_path))
    with a.lock("x"):
        with pytest.raises(dlock.DlockError) as e:
            b.acquire("x", timeout=0.05)
    err = e.value
    assert type(err) is dlock.ETIMEDOUT
    assert err.code == "DLOCK_ETIMEDOUT" and err.errno == -8
    assert err.message and err.message in str(err) and str(err).startswith("DLOCK_ETIMEDOUT: ")
    assert isinstance(err, OSError) and err.errno == -8
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is dlock.ETIMEDOUT and again.message == err.message
    with pytest.raises(ValueError):
        b.acquire("", blocking=False)
    with pytest.raises(ValueError):
        b.acquire("x", ttl=0)
    a.close()
    b.close()


def test_acquire_opts_layout():
    """dlock_acquire_opts_init_version(4) fills exactly our AcquireOpts: the
    fields match DLOCK_ACQUIRE_OPTS_INIT and nothing is written past its end;
    version 3 writes nothing past .cancel."""
    size = ctypes.sizeof(_lib.AcquireOpts)
    buf = (ctypes.c_ubyte * (size + 64))(*([0xAA] * (size + 64)))
    opts = _lib.AcquireOpts.from_buffer(buf)
    assert _lib.lib.dlock_acquire_opts_init_version(ctypes.byref(opts), 4) == 0
    assert (opts.version, opts.ttl_ms, opts.wait, opts.deadline_ns, opts.keep,
            opts.on_lost_user, opts.reentrant, opts.cancel, opts.mode, opts.limit) == \
        (4, 30000, 2, 0, 0, None, 0, None, 0, 0)
    assert not opts.on_lost
    assert bytes(buf[size:]) == b"\xaa" * 64
    old = (ctypes.c_ubyte * (size + 64))(*([0xAA] * (size + 64)))
    v3 = _lib.AcquireOpts.from_buffer(old)
    assert _lib.lib.dlock_acquire_opts_init_version(ctypes.byref(v3), 3) == 0
    assert v3.version == 3 and v3.cancel is None
    assert bytes(old[_lib.AcquireOpts.mode.offset:]) == b"\xaa" * (size + 64 - _lib.AcquireOpts.mode.offset)
    if ctypes.sizeof(ctypes.c_void_p) == 8:
        assert _lib.AcquireOpts.cancel.offset == 56
        assert _lib.AcquireOpts.mode.offset == 64 and _lib.AcquireOpts.limit.offset == 68
        assert size == 72
        assert ctypes.sizeof(_lib.Info) == 1272 and ctypes.sizeof(_lib.Metrics) == 1032
        assert ctypes.sizeof(_lib.Holder) == 128 and _lib.Holder.owner.offset == 32


def test_emode_is_exposed():
    """DLOCK_EMODE has its class, as every code of the table."""
    assert issubclass(dlock.EMODE, dlock.DlockError)
    assert dlock.error_class("DLOCK_EMODE") is dlock.EMODE
    assert dlock.error_class("EMODE") is dlock.EMODE
    e = dlock.error_class(-23)(-23)
    assert e.code == "DLOCK_EMODE" and isinstance(e, dlock.EMODE)
    assert "EMODE" in dlock.__all__


def _import_in_child(env):
    return subprocess.run([sys.executable, "-c", "import dlock; print(dlock.library_version)"],
                          env=env, capture_output=True, text=True, timeout=60)


def test_library_override_missing():
    env = dict(os.environ, DLOCK_LIBRARY="/nonexistent/libdlock.so")
    r = _import_in_child(env)
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "DLOCK_LIBRARY" in r.stderr, r.stderr


def test_library_from_loader_path():
    lib = os.environ.get("DLOCK_LIBRARY")
    if not lib:
        pytest.skip("the test run names no DLOCK_LIBRARY")
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(lib))
    del env["DLOCK_LIBRARY"]
    r = _import_in_child(env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == dlock.library_version


def test_inspect_and_metrics(tmp_path):
    with dlock.open("file://" + str(tmp_path)) as c:
        with c.lock("m") as lock:
            try:
                info = c.inspect("m")
            except dlock.ENOTSUP:
                info = None
            if info is not None and "held" in info:
                assert info["held"]
            if info is not None and "token" in info:
                assert info["token"] == lock.token
        m = c.metrics()
        assert m["granted"] == 1 and m["releases"] == 1
        assert m["wait"]["count"] == 1
        text = c.metrics_text('service="t"')
        assert 'dlock_acquires_total{service="t",result="granted"} 1' in text or \
            'result="granted"' in text
