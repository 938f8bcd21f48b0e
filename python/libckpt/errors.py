"""The library's error codes as a small hierarchy of exceptions.

Every failing call raises a CheckpointError subclass carrying the C code (`code`),
its name (`code_name`, as ckpt_strerror says) and the library's message naming the
object at fault (`message`, from ckpt_last_error). Errors the C library reports as
a negated errno are also OSErrors with that errno, so `except FileExistsError` and
`except TimeoutError` work as Python users expect.
"""
from __future__ import annotations

import errno as _errno
from typing import Dict, Optional, Type

from . import _lib

__all__ = [
    "CheckpointError", "CorruptError", "FormatError", "VersionError", "NotFoundError",
    "AbortedError", "InDoubtError", "InvalidNameError", "ShapeError", "DTypeError",
    "NotRootError", "NoManifestError", "RankBoundError", "AuthError", "ProtocolError",
    "PeerError", "StateError", "ValidationError", "NoDeviceError", "CheckpointOSError",
    "StepExistsError", "CheckpointTimeoutError", "BusyError", "MissingFileError", "raise_for", "check",
]


class CheckpointError(Exception):
    """A libckpt call failed. code: the C code (negative); message: the library's
    message naming the step, tensor, file or rank at fault."""

    code: int = 0

    def __init__(self, message: str, code: Optional[int] = None):
        if code is not None:
            self.code = code
        self.message = message
        super().__init__(message)

    @property
    def code_name(self) -> str:
        return _lib.strerror(self.code) if self.code else ""

    def __str__(self) -> str:
        return self.message


class CorruptError(CheckpointError):
    """Stored bytes fail their hash or structure check (CKPT_ECORRUPT)."""
    code = -1001


class FormatError(CheckpointError):
    """Not a libckpt file or manifest, or malformed metadata (CKPT_EFORMAT)."""
    code = -1002


class VersionError(FormatError):
    """Written by a newer, incompatible format version (CKPT_EVERSION)."""
    code = -1003


class NotFoundError(CheckpointError, LookupError):
    """No such step, tensor or blob (CKPT_ENOTFOUND)."""
    code = -1004


class AbortedError(CheckpointError):
    """The save was aborted: the step is not visible (CKPT_EABORTED)."""
    code = -1005


class InDoubtError(CheckpointError):
    """This rank voted and lost the coordinator: the manifest decides (CKPT_EINDOUBT)."""
    code = -1006


class InvalidNameError(CheckpointError, ValueError):
    """A tensor or blob name breaks the naming rules (CKPT_ENAME)."""
    code = -1007


class ShapeError(CheckpointError, ValueError):
    """Bad shape, a box outside the shape, or a size that overflows (CKPT_ESHAPE)."""
    code = -1008


class DTypeError(CheckpointError, TypeError):
    """The dtype differs from the stored one, or has no libckpt equivalent (CKPT_EDTYPE)."""
    code = -1009


class NotRootError(CheckpointError):
    """The directory is not a checkpoint root (CKPT_ENOTROOT)."""
    code = -1010


class RankBoundError(CheckpointError):
    """A rank-bound item asked for by another world size or rank (CKPT_ERANKBOUND)."""
    code = -1011


class AuthError(CheckpointError, PermissionError):
    """A peer failed authentication, or no secret for a job of several ranks (CKPT_EAUTH)."""
    code = -1012


class ProtocolError(CheckpointError):
    """Malformed or unexpected protocol message (CKPT_EPROTO)."""
    code = -1013


class PeerError(CheckpointError):
    """The coordinator rejected this rank or the job (CKPT_EPEER)."""
    code = -1014


class StateError(CheckpointError):
    """The call is not valid in the handle's state: submitted, closed (CKPT_ESTATE)."""
    code = -1015


class ValidationError(CheckpointError):
    """The gathered index failed validation: gaps, overlaps, replicas that differ
    (CKPT_EINVALID)."""
    code = -1016


class NoDeviceError(CheckpointError):
    """The transport, device or feature asked for is not available (CKPT_ENODEV)."""
    code = -1017


class NoManifestError(CheckpointError):
    """No usable manifest for the root here (CKPT_ENOMANIFEST): the root holds
    checkpoint data but its manifest was lost or damaged (run `ckpt-inspect ROOT
    rebuild`), or the manifest directory kept apart (manifest_dir) is on another
    host, or holds another root's manifest; the message says which."""
    code = -1018


class CheckpointOSError(CheckpointError, OSError):
    """A system error (a negated errno) from the library; .errno is set."""

    def __init__(self, message: str, code: int):
        CheckpointError.__init__(self, message, code)
        self.errno = -code
        self.strerror = message


class StepExistsError(CheckpointOSError, FileExistsError):
    """The step is already committed (-EEXIST), or a name was added twice."""


class CheckpointTimeoutError(CheckpointOSError, TimeoutError):
    """The wait timed out (-ETIMEDOUT); the save goes on."""


class BusyError(CheckpointOSError, BlockingIOError):
    """-EBUSY: the root is held by another coordinator, or the step has a save in flight."""


class MissingFileError(CheckpointOSError, FileNotFoundError):
    """-ENOENT: a file the library needed is missing (a shard file, a read-only root)."""


class _InvalidArgument(CheckpointOSError, ValueError):
    """-EINVAL: an argument the library refused."""


class _NoSpace(CheckpointOSError):
    """-ENOSPC."""


_BY_CODE: Dict[int, Type[CheckpointError]] = {
    cls.code: cls for cls in (
        CorruptError, FormatError, VersionError, NotFoundError, AbortedError,
        InDoubtError, InvalidNameError, ShapeError, DTypeError, NotRootError,
        RankBoundError, AuthError, ProtocolError, PeerError, StateError,
        ValidationError, NoDeviceError, NoManifestError)
}
_BY_ERRNO: Dict[int, Type[CheckpointOSError]] = {
    _errno.EEXIST: StepExistsError,
    _errno.ETIMEDOUT: CheckpointTimeoutError,
    _errno.EBUSY: BusyError,
    _errno.EINVAL: _InvalidArgument,
    _errno.ENOSPC: _NoSpace,
    _errno.ENOENT: MissingFileError,
}


def error_for(code: int, message: Optional[str] = None) -> CheckpointError:
    """The exception for C code (negative); message defaults to ckpt_last_error()."""
    if message is None:
        message = _lib.last_error() or _lib.strerror(code)
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(message, code)
    if -4096 < code < 0:
        return _BY_ERRNO.get(-code, CheckpointOSError)(message, code)
    return CheckpointError(message, code)


def raise_for(code: int, message: Optional[str] = None) -> None:
    raise error_for(code, message)


def check(code: int) -> int:
    """Return code when it is not negative, else raise its exception."""
    if code < 0:
        raise error_for(code)
    return code

