"""Exceptions raised by refit.

Every error of the native library arrives as a subclass of :class:`Error`,
chosen by its status code; ``code`` keeps the code's name (``"DATA_LOSS"``
...). The classes also derive from the closest built-in exception, so
``except ValueError`` or ``except FileNotFoundError`` work as expected.

========================  =====================  ===============================
class                     status codes           meaning, what to do
========================  =====================  ===============================
InvalidArgumentError      INVALID_ARGUMENT,      the caller passed something
                          OUT_OF_RANGE           malformed (also ValueError)
NotFoundError             NOT_FOUND              a path or object is missing
                                                 (also FileNotFoundError)
CorruptDataError          DATA_LOSS              a delta, checkpoint or stored
                                                 object is corrupt or truncated;
                                                 do not retry it
VersionMismatchError      FAILED_PRECONDITION    the checkpoint or tensors are
                                                 not the version a delta or
                                                 store expects (wrong base)
TransportError            UNAVAILABLE,           the store or network failed
                          RESOURCE_EXHAUSTED     after retries; retry later
DeadlineExceededError     DEADLINE_EXCEEDED      a wait ran past its deadline
                                                 (also TimeoutError)
AbortedError              ABORTED                the transaction (a version, an
                                                 apply) was aborted; retry it
AuthenticationError       UNAUTHENTICATED,       a key is missing or wrong
                          PERMISSION_DENIED
UnsupportedError          UNIMPLEMENTED          a dtype or feature refit does
                                                 not handle (NotImplementedError)
Error                     anything else          the base class
========================  =====================  ===============================
"""

from __future__ import annotations

from typing import Dict, Optional, Type


class Error(Exception):
    """Base class of every refit error."""

    def __init__(self, message: str, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or "UNKNOWN"

    def __str__(self) -> str:
        return self.message


class InvalidArgumentError(Error, ValueError):
    """Malformed arguments: wrong dtypes, shapes, tensor sets, options."""


class NotFoundError(Error, FileNotFoundError):
    """A path, tensor or stored object does not exist."""

    def __init__(self, message: str, code: Optional[str] = None) -> None:
        Error.__init__(self, message, code)

    def __str__(self) -> str:
        return self.message


class CorruptDataError(Error):
    """A delta, checkpoint or stored object failed its checks."""


class VersionMismatchError(Error):
    """The data is not the version the operation needs (wrong base)."""


class TransportError(Error):
    """The object store or network failed after retries."""


class DeadlineExceededError(Error, TimeoutError):
    """A wait ran past its deadline."""

    def __init__(self, message: str, code: Optional[str] = None) -> None:
        Error.__init__(self, message, code)

    def __str__(self) -> str:
        return self.message


class AbortedError(Error):
    """A version or apply was aborted; retrying the whole step is safe."""


class AuthenticationError(Error):
    """An object failed authentication, or access was denied."""


class UnsupportedError(Error, NotImplementedError):
    """A dtype or feature refit does not handle."""


_BY_CODE: Dict[str, Type[Error]] = {
    "INVALID_ARGUMENT": InvalidArgumentError,
    "OUT_OF_RANGE": InvalidArgumentError,
    "NOT_FOUND": NotFoundError,
    "DATA_LOSS": CorruptDataError,
    "FAILED_PRECONDITION": VersionMismatchError,
    "UNAVAILABLE": TransportError,
    "RESOURCE_EXHAUSTED": TransportError,
    "DEADLINE_EXCEEDED": DeadlineExceededError,
    "ABORTED": AbortedError,
    "UNAUTHENTICATED": AuthenticationError,
    "PERMISSION_DENIED": AuthenticationError,
    "UNIMPLEMENTED": UnsupportedError,
}


def _from_status(code: str, message: str) -> Error:
    """Builds the exception for a native status (called by refit._native)."""
    return _BY_CODE.get(code, Error)(message, code)


__all__ = [
    "Error",
    "InvalidArgumentError",
    "NotFoundError",
    "CorruptDataError",
    "VersionMismatchError",
    "TransportError",
    "DeadlineExceededError",
    "AbortedError",
    "AuthenticationError",
    "UnsupportedError",
]
