"""Fixtures: one run of each store case per store URI.

file:// runs in a temporary directory; the networked stores come from the
environment (DLOCK_REDIS_URI, ... as scripts/stores/start.sh prints them).
A store missing from the environment skips its cases, unless
DLOCK_STORES_REQUIRED=1 (CI), which fails them instead.
"""

import os
import secrets

import pytest

import dlock

STORE_ENV = {
    "redis": "DLOCK_REDIS_URI",
    "postgres": "DLOCK_POSTGRES_URI",
    "mysql": "DLOCK_MYSQL_URI",
    "zookeeper": "DLOCK_ZK_URI",
    "etcd": "DLOCK_ETCD_URI",  # carries its credentials (user:password@)
}
STORES = ["file"] + list(STORE_ENV)
RUN = "py-{}-{}".format(os.getpid(), secrets.token_hex(3))


def stores_required():
    return os.environ.get("DLOCK_STORES_REQUIRED") == "1"


def missing(why):
    if stores_required():
        pytest.fail(why + " (DLOCK_STORES_REQUIRED=1)")
    pytest.skip(why)


@pytest.fixture(params=STORES)
def store_uri(request, tmp_path):
    """The URI of one store; its cases skip when the store is not set up."""
    if request.param == "file":
        return "file://" + str(tmp_path / "locks")
    var = STORE_ENV[request.param]
    uri = os.environ.get(var)
    if not uri:
        missing("{} is not set".format(var))
    try:
        dlock.open(uri).close()
    except dlock.ENOBACKEND:
        missing("libdlock was built without the {} backend".format(request.param))
    return uri


@pytest.fixture
def name(request):
    """A lock name no other run or case uses."""
    return "{}-{}-{}".format(RUN, request.node.originalname, secrets.token_hex(3))


@pytest.fixture
def clients(store_uri):
    """clients(n): n clients on the store, closed after the case."""
    made = []

    def make(n=1):
        new = [dlock.open(store_uri) for _ in range(n)]
        made.extend(new)
        return new[0] if n == 1 else new

    yield make
    for c in made:
        c.close()
