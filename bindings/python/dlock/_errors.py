"""Exceptions: one class per code of libdlock's error table.

The classes are made at import from the loaded library (dlock_err_name() for
-1, -2, ... until it no longer knows the code), so a code appended to the
table in C gets its class without a change here. A class is named after the
code without its prefix (DLOCK_EBUSY -> dlock.EBUSY), as the errno module
names its codes. Where Python has a builtin exception for the same failure,
the class derives from it too, so code that already catches TimeoutError,
ValueError or ConnectionError keeps working.
"""

from ._lib import lib

# Builtin bases by code name: only where the meaning is the same.
_BUILTIN_BASES = {
    "DLOCK_EINVAL": ValueError,
    "DLOCK_EBADURI": ValueError,
    "DLOCK_ESCHEME": ValueError,
    "DLOCK_ECONNECT": ConnectionError,
    "DLOCK_EAUTH": PermissionError,
    "DLOCK_ETIMEDOUT": TimeoutError,
    "DLOCK_ENOMEM": MemoryError,
    "DLOCK_EINTR": InterruptedError,
}


class DlockError(Exception):
    """A libdlock call failed.

    .code    the code's name, e.g. 'DLOCK_EBUSY'
    .errno   its number, e.g. -7 (negative, as libdlock returns it)
    .message the detail libdlock gave (dlock_errmsg()), or the code's text
    """

    def __init__(self, errno, message=None):
        text = lib.dlock_strerror(errno).decode()
        message = message or text
        # One argument, so that the builtin bases (OSError's in particular)
        # do not read it as (errno, strerror).
        super().__init__(message)
        self.errno = errno
        self.code = lib.dlock_err_name(errno).decode()
        self.message = message

    def __str__(self):
        return "{}: {}".format(self.code, self.message)

    def __reduce__(self):
        return (error, (self.errno, self.message))


def _make_classes():
    classes = {}
    code = -1
    while True:
        name = lib.dlock_err_name(code).decode()
        if name == "DLOCK_UNKNOWN":
            break
        short = name[len("DLOCK_"):]
        bases = (DlockError,)
        if name in _BUILTIN_BASES:
            bases += (_BUILTIN_BASES[name],)
        doc = "{} ({}): {}.".format(name, code, lib.dlock_strerror(code).decode())
        classes[code] = type(short, bases, {"__doc__": doc, "__module__": "dlock"})
        code -= 1
    return classes


by_errno = _make_classes()
by_name = {cls.__name__: cls for cls in by_errno.values()}


def error(errno, message=None):
    """The exception for a libdlock result code (DlockError itself for a
    code this library does not know)."""
    return by_errno.get(errno, DlockError)(errno, message)


DlockError.__module__ = "dlock"
