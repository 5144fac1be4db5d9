"""Loading libdlock and declaring its C API for ctypes.

Everything here mirrors include/dlock.h: the structs must match the C
layout field for field (ctypes lays them out with the platform's C rules),
and each function gets its argument and result types so that pointers are
never truncated to int. Only this module touches the raw library.
"""

import ctypes
import ctypes.util
import os

# The major version of libdlock this package is written for. Structs are
# versioned on their own (their first field), so any minor release of this
# major works as long as it has the calls declared below.
ABI_MAJOR = 0

# dlock_acquire_opts version 4 (.mode, .limit), filled by
# dlock_acquire_opts_init_version(); dlock_info 1, dlock_metrics 1.
ACQUIRE_OPTS_VERSION = 4
INFO_VERSION = 1
METRICS_VERSION = 1
LEADER_VERSION = 1

WAIT_TRY = 0
WAIT_DEADLINE = 1
WAIT_FOREVER = 2

MODE_EXCLUSIVE = 0
MODE_SHARED = 1
LIMIT_MAX = 65535

NAME_MAX = 4096
HOLDER_MAX = 64
INFO_LISTED = 16
METRICS_BUCKETS = 25
METRICS_ERRORS = 32
VALUE_MAX = 1024  # a leader's value, bytes
WAIT_FOREVER_MS = 2**32 - 1  # dlock_observer_next(): wait until a change comes

# Capability bits (include/dlock_backend.h): part of the ABI.
CAP_LEASE = 1 << 0
CAP_RENEW = 1 << 1
CAP_FENCING = 1 << 2
CAP_FIFO = 1 << 3
CAP_BLOCKING = 1 << 4
CAP_SHARED = 1 << 5
CAP_DEADLINE = 1 << 6
CAP_HOLDER_DEATH = 1 << 7
CAP_RAISE = 1 << 8
CAP_CANCEL = 1 << 9
CAP_SEMAPHORE = 1 << 10
CAP_ELECTION = 1 << 11
CAP_WATCH = 1 << 12
CAP_TOKEN_SHARED = 1 << 13

c_client_p = ctypes.c_void_p
c_lock_p = ctypes.c_void_p
c_cancel_p = ctypes.c_void_p
c_observer_p = ctypes.c_void_p

# void (*dlock_lost_fn)(dlock_lock *lock, int err, void *user)
LOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)


class AcquireOpts(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("ttl_ms", ctypes.c_uint32),
        ("wait", ctypes.c_int),  # enum dlock_wait
        ("deadline_ns", ctypes.c_uint64),
        # version 2
        ("keep", ctypes.c_int),
        ("on_lost", LOST_FN),
        ("on_lost_user", ctypes.c_void_p),
        ("reentrant", ctypes.c_int),
        # version 3
        ("cancel", c_cancel_p),
        # version 4
        ("mode", ctypes.c_int),  # enum dlock_mode
        ("limit", ctypes.c_uint32),
    ]


class Info(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("known", ctypes.c_uint),
        ("held", ctypes.c_int),
        ("token", ctypes.c_uint64),
        ("owner", ctypes.c_char * HOLDER_MAX),
        ("lease_ms", ctypes.c_uint64),
        ("waiters", ctypes.c_uint64),
        ("listed", ctypes.c_size_t),
        ("waiter", (ctypes.c_char * HOLDER_MAX) * INFO_LISTED),
        ("last_token", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 16),
    ]


KNOWS_HELD = 1 << 0
KNOWS_TOKEN = 1 << 1
KNOWS_OWNER = 1 << 2
KNOWS_LEASE = 1 << 3
KNOWS_WAITERS = 1 << 4
KNOWS_ORDER = 1 << 5
KNOWS_LAST_TOKEN = 1 << 6
KNOWS_MODE = 1 << 7


class LeaderInfo(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("known", ctypes.c_uint),
        ("held", ctypes.c_int),
        ("err", ctypes.c_int),
        ("term", ctypes.c_uint64),
        ("lease_ms", ctypes.c_uint64),
        ("owner", ctypes.c_char * HOLDER_MAX),
        ("value_len", ctypes.c_size_t),
        ("value", ctypes.c_char * (VALUE_MAX + 1)),
        ("reserved", ctypes.c_uint64 * 8),
    ]


class Holder(ctypes.Structure):
    _fields_ = [
        ("known", ctypes.c_uint),
        ("mode", ctypes.c_int),  # enum dlock_mode
        ("limit", ctypes.c_uint32),
        ("token", ctypes.c_uint64),
        ("lease_ms", ctypes.c_uint64),
        ("owner", ctypes.c_char * HOLDER_MAX),
        ("reserved", ctypes.c_uint64 * 4),
    ]


class Histogram(ctypes.Structure):
    _fields_ = [
        ("count", ctypes.c_uint64),
        ("sum_ns", ctypes.c_uint64),
        ("le", ctypes.c_uint64 * METRICS_BUCKETS),
    ]


class Metrics(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("granted", ctypes.c_uint64),
        ("busy", ctypes.c_uint64),
        ("timed_out", ctypes.c_uint64),
        ("failed", ctypes.c_uint64),
        ("errors", ctypes.c_uint64 * METRICS_ERRORS),
        ("releases", ctypes.c_uint64),
        ("releases_lost", ctypes.c_uint64),
        ("renewals", ctypes.c_uint64),
        ("renewal_failures", ctypes.c_uint64),
        ("losses", ctypes.c_uint64),
        ("reconnects", ctypes.c_uint64),
        ("wait", Histogram),
        ("hold", Histogram),
        ("reserved", ctypes.c_uint64 * 32),
    ]


_P = ctypes.POINTER
_PROTOTYPES = {
    # name: (result, [arguments])
    "dlock_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "dlock_err_name": (ctypes.c_char_p, [ctypes.c_int]),
    "dlock_version": (ctypes.c_char_p, []),
    "dlock_monotonic_ns": (ctypes.c_uint64, []),
    "dlock_client_open": (ctypes.c_int, [ctypes.c_char_p, _P(c_client_p)]),
    "dlock_client_close": (None, [c_client_p]),
    "dlock_errmsg": (ctypes.c_char_p, [c_client_p]),
    "dlock_client_backend": (ctypes.c_char_p, [c_client_p]),
    "dlock_client_caps": (ctypes.c_uint, [c_client_p]),
    "dlock_client_ping": (ctypes.c_int, [c_client_p]),
    "dlock_inspect": (ctypes.c_int, [c_client_p, ctypes.c_char_p, _P(Info)]),
    "dlock_inspect_holders": (ctypes.c_int, [c_client_p, ctypes.c_char_p, _P(Holder),
                                             ctypes.c_size_t, _P(ctypes.c_size_t)]),
    "dlock_client_metrics": (ctypes.c_int, [c_client_p, _P(Metrics)]),
    "dlock_metrics_format": (ctypes.c_int, [_P(Metrics), ctypes.c_char_p, ctypes.c_char_p,
                                            ctypes.c_size_t]),
    "dlock_cancel_new": (ctypes.c_int, [_P(c_cancel_p)]),
    "dlock_cancel_fire": (None, [c_cancel_p]),
    "dlock_cancel_fired": (ctypes.c_int, [c_cancel_p]),
    "dlock_cancel_free": (None, [c_cancel_p]),
    "dlock_acquire_opts_init_version": (ctypes.c_int, [_P(AcquireOpts), ctypes.c_uint]),
    "dlock_acquire_n": (ctypes.c_int, [c_client_p, ctypes.c_char_p, ctypes.c_size_t,
                                       _P(AcquireOpts), _P(c_lock_p)]),
    "dlock_acquire_names": (ctypes.c_int, [c_client_p, _P(ctypes.c_char_p), ctypes.c_size_t,
                                           _P(AcquireOpts), _P(c_lock_p)]),
    "dlock_release": (ctypes.c_int, [c_lock_p]),
    "dlock_renew": (ctypes.c_int, [c_lock_p, ctypes.c_uint32]),
    "dlock_lock_token": (ctypes.c_uint64, [c_lock_p]),
    "dlock_lock_raise_token": (ctypes.c_int, [c_lock_p, ctypes.c_uint64]),
    "dlock_lock_name": (ctypes.c_void_p, [c_lock_p, _P(ctypes.c_size_t)]),
    "dlock_lock_name_count": (ctypes.c_size_t, [c_lock_p]),
    "dlock_lock_name_at": (ctypes.c_void_p, [c_lock_p, ctypes.c_size_t, _P(ctypes.c_size_t)]),
    "dlock_lock_owner": (ctypes.c_char_p, [c_lock_p]),
    "dlock_lock_expires_ns": (ctypes.c_uint64, [c_lock_p]),
    "dlock_lock_lost": (ctypes.c_int, [c_lock_p]),
    "dlock_lock_lost_fd": (ctypes.c_int, [c_lock_p]),
    "dlock_lock_lost_detail": (ctypes.c_char_p, [c_lock_p]),
    "dlock_lock_holds": (ctypes.c_uint, [c_lock_p]),
}

# Elections: declared when the library has them (ELECTION is True); a
# libdlock without them still loads, and their calls raise dlock.ENOTSUP.
_ELECTION_PROTOTYPES = {
    "dlock_campaign": (ctypes.c_int, [c_client_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_size_t, _P(AcquireOpts), _P(c_lock_p)]),
    "dlock_proclaim": (ctypes.c_int, [c_lock_p, ctypes.c_char_p, ctypes.c_size_t]),
    "dlock_resign": (ctypes.c_int, [c_lock_p]),
    "dlock_leader": (ctypes.c_int, [c_client_p, ctypes.c_char_p, _P(LeaderInfo)]),
    "dlock_observe": (ctypes.c_int, [c_client_p, ctypes.c_char_p, ctypes.c_void_p,
                                     ctypes.c_void_p, _P(c_observer_p)]),
    "dlock_observer_fd": (ctypes.c_int, [c_observer_p]),
    "dlock_observer_next": (ctypes.c_int, [c_observer_p, _P(LeaderInfo), ctypes.c_uint32]),
    "dlock_observer_reads": (ctypes.c_uint64, [c_observer_p]),
    "dlock_observer_close": (None, [c_observer_p]),
}


def _candidates():
    override = os.environ.get("DLOCK_LIBRARY")
    if override:
        return [override]
    names = ["libdlock.so.0"]
    found = ctypes.util.find_library("dlock")
    if found and found not in names:
        names.append(found)
    return names


def load():
    """Loads libdlock (DLOCK_LIBRARY, else the system loader's libdlock.so.0)
    and declares its functions. Raises ImportError saying what to do."""
    errors = []
    lib = None
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as e:
            errors.append(str(e))
    if lib is None:
        raise ImportError(
            "dlock: cannot load libdlock ({}). Install libdlock (e.g. `meson install`), "
            "add its directory to LD_LIBRARY_PATH, or set DLOCK_LIBRARY=/path/to/libdlock.so"
            .format("; ".join(errors)))
    missing = [f for f in _PROTOTYPES if not hasattr(lib, f)]
    if missing:
        raise ImportError("dlock: the libdlock at {} lacks {} (too old for this package: "
                          "it needs shared locks and semaphores, acquire options version {})"
                          .format(getattr(lib, "_name", "?"), ", ".join(missing),
                                  ACQUIRE_OPTS_VERSION))
    global ELECTION
    ELECTION = all(hasattr(lib, f) for f in _ELECTION_PROTOTYPES)
    for fname, (res, args) in list(_PROTOTYPES.items()) + (
            list(_ELECTION_PROTOTYPES.items()) if ELECTION else []):
        f = getattr(lib, fname)
        f.restype = res
        f.argtypes = args
    version = lib.dlock_version().decode()
    try:
        major = int(version.split(".")[0])
    except ValueError:
        major = -1
    if major != ABI_MAJOR:
        raise ImportError("dlock: libdlock {} at {} is not version {}.x, which this package is "
                          "written for".format(version, lib._name, ABI_MAJOR))
    return lib, version


ELECTION = False
lib, version = load()
