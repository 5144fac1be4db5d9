"""rediss:// through the package (the library's TLS transport: the whole
conformance suite runs over it in C): a lock over TLS taken, refused to a
second client and handed on with a higher token; a server certificate
that the given CA did not sign refused as dlock.EAUTH, saying why."""

import os

import pytest

import dlock


def tls_uri():
    uri = os.environ.get("DLOCK_REDIS_TLS_URI")
    if not uri:
        why = "DLOCK_REDIS_TLS_URI is not set"
        if os.environ.get("DLOCK_STORES_REQUIRED") == "1":
            pytest.fail(why + " (DLOCK_STORES_REQUIRED=1)")
        pytest.skip(why)
    return uri


def test_tls_lock(name):
    uri = tls_uri()
    a, b = dlock.open(uri), dlock.open(uri)
    try:
        first = a.acquire(name, blocking=False)
        with pytest.raises(dlock.EBUSY):
            b.acquire(name, blocking=False)
        first.release()
        second = b.acquire(name, timeout=5)
        assert second.token > first.token
        second.release()
    finally:
        a.close()
        b.close()


def test_tls_unknown_ca():
    uri = tls_uri()
    bad = uri.replace("/ca.crt", "/other-ca.crt")
    assert bad != uri, "the TLS URI names its CA file ca.crt"
    with pytest.raises(dlock.EAUTH) as e:
        dlock.open(bad)
    assert "certificate" in str(e.value)
