"""dlock: distributed locks over Redis, PostgreSQL, MySQL, ZooKeeper, etcd
and local files, from libdlock (loaded with ctypes).

    import dlock
    with dlock.open("redis://127.0.0.1:6379/0") as client:
        with client.lock("reports", ttl=10, timeout=5) as lock:
            write_report(fence=lock.token)

Every exception is a dlock.DlockError with .code ('DLOCK_EBUSY'), .errno
(-7) and .message; each code has its class (dlock.EBUSY, dlock.ETIMEDOUT,
...). Leader election: client.campaign(), client.leader(), client.observe().
The asyncio form is dlock.aio. See README.md beside this package.
"""

from . import _errors
from ._core import Cancel, Client, Leader, Leadership, Lock, Observer, monotonic, open  # noqa: A004
from ._errors import DlockError
from ._lib import (CAP_BLOCKING, CAP_CANCEL, CAP_DEADLINE, CAP_ELECTION, CAP_FENCING,
                   CAP_FIFO, CAP_HOLDER_DEATH, CAP_LEASE, CAP_RAISE, CAP_RENEW, CAP_SEMAPHORE,
                   CAP_SHARED, CAP_TOKEN_SHARED, CAP_WATCH)
from ._lib import version as library_version

__version__ = "0.1.0"

# dlock.EBUSY, dlock.ETIMEDOUT, ...: one class per code of the loaded
# library's error table.
globals().update(_errors.by_name)
errors = dict(_errors.by_name)


def error_class(code):
    """The exception class for a code name ('DLOCK_EBUSY' or 'EBUSY') or
    number (-7)."""
    if isinstance(code, int):
        return _errors.by_errno.get(code, DlockError)
    if code.startswith("DLOCK_"):
        code = code[len("DLOCK_"):]
    return _errors.by_name[code]


__all__ = ["open", "Client", "Lock", "Leadership", "Leader", "Observer", "Cancel",
           "DlockError", "monotonic", "error_class", "errors", "library_version",
           "CAP_BLOCKING", "CAP_CANCEL", "CAP_DEADLINE", "CAP_ELECTION", "CAP_FENCING",
           "CAP_FIFO", "CAP_HOLDER_DEATH", "CAP_LEASE", "CAP_RAISE", "CAP_RENEW",
           "CAP_SEMAPHORE", "CAP_SHARED", "CAP_TOKEN_SHARED", "CAP_WATCH"] + sorted(_errors.by_name)
