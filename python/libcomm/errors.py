"""comm_status_t as Python exceptions, each carrying comm_last_error's message."""

import builtins

from ._lib import lib

OK = 0
INVALID_ARGUMENT = 1
INVALID_USAGE = 2
SYSTEM = 3
TIMEOUT = 4
REMOTE = 5
ABORTED = 6
UNAVAILABLE = 7
INTERNAL = 8


class CommError(Exception):
    """A libcomm call failed. `status` is the comm_status_t value, `message` the detail
    (which rank, which operation, what to do) from comm_last_error."""

    status = None

    def __init__(self, message, status=None):
        if status is not None:
            self.status = status
        self.message = message
        super().__init__(message)


class InvalidArgumentError(CommError, ValueError):
    """Bad input found locally before anything moved; the communicator stays usable."""
    status = INVALID_ARGUMENT


class InvalidUsageError(CommError):
    """Ranks disagree on a collective, or a call out of order. The communicator is broken."""
    status = INVALID_USAGE


class CommSystemError(CommError, OSError):
    status = SYSTEM


class CommTimeoutError(CommError, builtins.TimeoutError):
    status = TIMEOUT


class RemoteError(CommError):
    """A peer failed or aborted."""
    status = REMOTE


class AbortedError(CommError):
    status = ABORTED


class UnavailableError(CommError):
    """The backend or transport is not present."""
    status = UNAVAILABLE


class InternalError(CommError):
    status = INTERNAL


_BY_STATUS = {cls.status: cls for cls in (
    InvalidArgumentError, InvalidUsageError, CommSystemError, CommTimeoutError, RemoteError,
    AbortedError, UnavailableError, InternalError)}


def status_string(status):
    s = lib.comm_status_string(status)
    return s.decode() if s else f"unknown status {status}"


def check(status, what):
    """Raises the exception of `status` unless it is COMM_OK. Must run on the thread that
    made the call: comm_last_error is the calling thread's last failure."""
    if status == OK:
        return
    detail = (lib.comm_last_error(None) or b"").decode(errors="replace")
    name = status_string(status)
    message = f"{what}: {name}" + (f"; {detail}" if detail else "")
    raise _BY_STATUS.get(status, CommError)(message, status)


def invalid(message):
    """An argument error found by the binding itself, before calling into libcomm."""
    return InvalidArgumentError(message, INVALID_ARGUMENT)
