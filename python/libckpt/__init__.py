"""libckpt — a distributed checkpoint storage engine, from Python.

A thin layer over the C library libckpt.so: every save, load, commit and listing
is the library's own (include/ckpt/ckpt.h); this package maps arrays and tensors
onto it and its error codes onto exceptions. docs/python.md is the guide.

    import libckpt
    with libckpt.Checkpointer("/ckpt/job") as ck:
        s = ck.save(step, {"model/w": w}, meta={"loss": 1.25})
        s.wait_snapshot()        # w may change from here
        ...
        s.wait()                 # durable and committed on every rank
        with ck.load() as ld:    # the latest committed step
            w2 = ld.read("model/w")

libckpt.torch saves and loads whole state_dicts (model, optimizer, scheduler, RNG,
DTensor shards); libckpt.dcp plugs libckpt under torch.distributed.checkpoint.
"""
from ._lib import LATEST, LibraryNotFoundError, library_path
from ._lib import version as _version
from .arrays import DTYPES
from .core import (KINDS, POLICIES, Checkpointer, ItemInfo, Load, Save, SaveStats,
                   StepInfo)
from .errors import (AbortedError, AuthError, BusyError, CheckpointError,
                     CheckpointOSError, CheckpointTimeoutError, CorruptError, DTypeError,
                     FormatError, InDoubtError, InvalidNameError, MissingFileError,
                     NoDeviceError, NoManifestError, NotFoundError, NotRootError,
                     PeerError, ProtocolError, RankBoundError, ShapeError, StateError,
                     StepExistsError, ValidationError, VersionError)

__version__ = "0.2.0"
library_version = _version()

open = Checkpointer  # noqa: A001 - libckpt.open(root) reads as it does in C

__all__ = [
    "Checkpointer", "open", "Save", "Load", "StepInfo", "ItemInfo", "SaveStats",
    "LATEST", "KINDS", "POLICIES", "DTYPES", "library_path", "library_version",
    "LibraryNotFoundError",
    "CheckpointError", "CorruptError", "FormatError", "VersionError", "NotFoundError",
    "AbortedError", "InDoubtError", "InvalidNameError", "ShapeError", "DTypeError",
    "NotRootError", "NoManifestError", "RankBoundError", "AuthError", "ProtocolError",
    "PeerError", "StateError", "ValidationError", "NoDeviceError", "CheckpointOSError",
    "StepExistsError", "CheckpointTimeoutError", "BusyError", "MissingFileError",
]
