"""The exceptions dlop raises: one class per error code of its native parts.

Every class derives from :class:`Error` and from the builtin a caller would
catch anyway: ``ValueError`` for a bad argument, ``TimeoutError`` for a
timeout, ``OSError`` for a failed system call, ``RuntimeError`` for the rest.
Failures of communication (a dead peer, a timeout, the transport, a malformed
message, an operation canceled by an earlier failure) also derive from
``torch.distributed.DistBackendError``, which is what torch's own backends
(Gloo, NCCL) raise for them: code written for those keeps catching dlop's.

The native module raises these through ``_BY_CODE``, the one table from a code
(its C++ ``errc_name``) to a class; ``Error.code`` holds that name. Two C++
subclasses of dlop::Error have Python subclasses of their code's class:
SampleError (an invalid argument) and NoOffloaderError (a dead peer).
"""

from __future__ import annotations

import builtins

from torch.distributed import DistBackendError

__all__ = [
    "Error",
    "InvalidArgumentError",
    "SampleError",
    "TimeoutError",
    "PeerDeadError",
    "CanceledError",
    "TransportError",
    "ProtocolError",
    "SystemError",
    "NoOffloaderError",
]


class Error(Exception):
    """Base of every error dlop's native parts raise."""

    code: str = ""


class InvalidArgumentError(Error, ValueError):
    """An argument dlop refused before doing anything (a bad size, dtype, layout, spec...)."""

    code = "invalid argument"


class SampleError(InvalidArgumentError):
    """One sample's data is unreadable, corrupt, truncated or unsupported."""


class TimeoutError(Error, DistBackendError, builtins.TimeoutError):  # noqa: A001  (dlop.TimeoutError)
    """An operation or a wait ran past its timeout."""

    code = "timeout"


class PeerDeadError(Error, DistBackendError):
    """A peer (another rank, a dlop-offloader) died or closed its connection."""

    code = "peer dead"


class CanceledError(Error, DistBackendError):
    """An operation given up because an earlier one failed or the engine shut down."""

    code = "canceled"


class TransportError(Error, DistBackendError):
    """The transport (UCX, shared memory, the store's sockets, MPI) failed."""

    code = "transport error"


class ProtocolError(Error, DistBackendError):
    """A peer sent something malformed or out of turn, or ranks disagree on an operation."""

    code = "protocol error"


class SystemError(Error, DistBackendError, builtins.OSError):  # noqa: A001  (dlop.SystemError)
    """A system call or a system library failed (memory, files, sockets, OpenSSL)."""

    code = "system error"


class NoOffloaderError(PeerDeadError):
    """No dlop-offloader serves an OffloadLoader: none answered, each refused it (its token, its
    configuration), no token was given, or every one was lost and none came back in time. Raised with
    ``fallback="error"``, the default when offloaders are named."""


_BY_CODE: dict[str, type[Error]] = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        TimeoutError,
        PeerDeadError,
        CanceledError,
        TransportError,
        ProtocolError,
        SystemError,
    )
}
