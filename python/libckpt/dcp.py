"""libckpt under torch.distributed.checkpoint (DCP): a StorageWriter and a
StorageReader, so that DCP's save, async_save and load run unchanged on libckpt.

    import torch.distributed.checkpoint as dcp
    import libckpt.dcp

    w = libckpt.dcp.Writer("/ckpt/job")              # keep it for the job's life
    dcp.save(sd, storage_writer=w, checkpoint_id=100)   # step 100
    dcp.load(sd, storage_reader=libckpt.dcp.Reader("/ckpt/job"))   # the latest step

A DCP checkpoint is one libckpt step, and it becomes visible only by libckpt's
commit: dcp.save returns on the coordinator's finish() once ckpt_save_wait has
reported the step durable on every rank and committed, and a failure on any rank
(before or after its data was handed over) leaves no committed step and makes
dcp.save raise on every rank.

Steps. checkpoint_id (dcp.save/load's argument, or reset()) is a step number: an int
or a string of digits. Without one the writer uses its step argument, and without
that the latest committed step + 1 (rank 0 decides and broadcasts it over the
default process group); the reader uses its step argument, else the latest
committed step (again decided by rank 0).

Items. Every WriteItem is one libckpt item named by its DCP key (fqn), escaped so
that any key is a valid libckpt name: '%', '/' and control characters become %XX, a
leading '.' becomes %2E (item_name, fqn_of). A tensor item is a sharded tensor: the
item's chunk is this rank's box in the global shape (after DCP's deduplication the
boxes of all ranks tile the shape). A BYTE_IO item (any non-tensor value, pickled by
DCP's planner) is a sharded 1-D u8 tensor of its bytes, readable by any rank of any
world size. Reads go by name and box through libckpt's resharding load, so a
checkpoint saved by W ranks loads on any number of ranks.

Metadata. DCP's Metadata is pickled into the item ".dcp/metadata" of the same step,
saved by DCP's coordinator rank. DCP hands the metadata only to finish(), after
every rank's write_data; DefaultSavePlanner however keeps it as planner.metadata
once it has made the global plan, so when the planner is a DefaultSavePlanner whose
create_global_plan is not overridden the coordinator adds the metadata in
write_data and submits at once. With any other planner the coordinator keeps its
save open (its tensors added, referenced, not yet copied) until finish() adds the
metadata DCP passes and submits. Like DCP's own .metadata file it is a pickle:
load only from roots you trust.

Ranks. The Checkpointer is opened on first use, with rank and world from
torch.distributed when it is initialized (else rank 0 of 1: DCP saves without a
process group as one process). A job of several ranks needs a secret: the
checkpointer keyword secret=, CKPT_JOB_SECRET or CKPT_JOB_SECRET_FILE; without one
rank 0 draws 32 random bytes and broadcasts them over the default process group
(libckpt.torch.open). The coordinator's address is the C library's (CKPT_COORD_ADDR
/ MASTER_ADDR, port CKPT_COORD_PORT / MASTER_PORT+1: docs/api.md). A Checkpointer
already open may be passed instead of a root (checkpointer=); the plugin does not
close it.

Handles. A rank other than DCP's coordinator returns from write_data at its
snapshot point (its tensors copied out), never waiting for the commit, which may
need the other ranks' later steps. Its save handle is freed at the writer's next
save, or by close(): keep the writer (or the Checkpointer) alive until then, or
call close(). async_save works with the default thread executor; DCP stages the
state_dict to CPU itself.

Errors: libckpt's exceptions (libckpt.errors) with the C library's message. DCP
wraps every rank's failure in its CheckpointException; .failures maps each failed
rank to the exception it raised.
"""
from __future__ import annotations

import ctypes
import dataclasses
import io
import logging
import os
import pickle
import re
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

_TORCH_NEEDED = (2, 4)


def _torch_version(v: str) -> Tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


try:
    import torch
except ImportError as _e:
    raise ImportError("libckpt.dcp needs torch >= 2.4 (the StorageWriter and "
                      "StorageReader API of torch.distributed.checkpoint); torch is "
                      "not installed") from _e
if _torch_version(torch.__version__) < _TORCH_NEEDED:
    raise ImportError("libckpt.dcp needs torch >= 2.4 (the StorageWriter and "
                      "StorageReader API of torch.distributed.checkpoint); this is torch "
                      f"{torch.__version__}")

from torch.distributed.checkpoint.default_planner import DefaultSavePlanner  # noqa: E402
from torch.distributed.checkpoint.metadata import Metadata  # noqa: E402
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan,  # noqa: E402
                                                  LoadPlanner, SavePlan, SavePlanner,
                                                  WriteItemType)
from torch.distributed.checkpoint.storage import (StorageReader,  # noqa: E402
                                                  StorageWriter, WriteResult)
from torch.futures import Future  # noqa: E402

try:
    from torch.distributed.checkpoint.metadata import StorageMeta
except ImportError:  # pragma: no cover - torch without StorageMeta
    StorageMeta = None  # type: ignore[assignment,misc]

from . import torch as _lt  # noqa: E402
from .arrays import dtype_code, torch_dtype_for  # noqa: E402
from .core import Checkpointer, Load, Save  # noqa: E402
from .errors import InvalidNameError, ShapeError, StateError  # noqa: E402

__all__ = ["Writer", "Reader", "item_name", "fqn_of", "METADATA_ITEM"]

METADATA_ITEM = ".dcp/metadata"
_DCP_VERSION = "1.0.0"          # DCP's metadata format version, as its own writer sets
_log = logging.getLogger("libckpt.dcp")

# ------------------------------------------------------------------ names


def item_name(fqn: str) -> str:
    """The libckpt item name of DCP key fqn: '%', '/' and control characters as %XX,
    a leading '.' as %2E. No escaped key holds a '/' or starts with '.', so no key
    can reach METADATA_ITEM. Raises InvalidNameError for an empty or non-str key."""
    if not isinstance(fqn, str) or not fqn:
        raise InvalidNameError(f"DCP key {fqn!r}: a key must be a non-empty str", -1007)
    out = []
    for i, ch in enumerate(fqn):
        if ch in "%/" or ord(ch) < 0x20 or (i == 0 and ch == "."):
            out.append("%%%02X" % ord(ch))
        else:
            out.append(ch)
    return "".join(out)


def fqn_of(name: str) -> str:
    """The DCP key of an item name made by item_name (its inverse)."""
    return re.sub(r"%([0-9A-F]{2})", lambda m: chr(int(m.group(1), 16)), name)


def _parse_step(checkpoint_id: Any, what: str = "checkpoint_id") -> Optional[int]:
    if checkpoint_id is None:
        return None
    if isinstance(checkpoint_id, int) and not isinstance(checkpoint_id, bool):
        if checkpoint_id >= 0:
            return checkpoint_id
    elif isinstance(checkpoint_id, str) and checkpoint_id.isascii() \
            and checkpoint_id.isdigit():
        return int(checkpoint_id)
    raise ValueError(f"{what} {checkpoint_id!r}: libckpt.dcp takes a step number "
                     "(an int >= 0 or a string of digits)")


def _valid_id(checkpoint_id: Any) -> bool:
    try:
        return _parse_step(checkpoint_id) is not None
    except ValueError:
        return False


_KIND_BY_TOP = {"optim": "optimizer", "optimizer": "optimizer", "optimizers": "optimizer",
                "optim_state": "optimizer", "scheduler": "scheduler",
                "lr_scheduler": "scheduler", "schedulers": "scheduler",
                "rng": "rng", "rng_state": "rng"}


def _kind_of(fqn: str, is_bytes: bool) -> str:
    kind = _KIND_BY_TOP.get(fqn.split(".", 1)[0])
    return kind or ("extra" if is_bytes else "model")


# ------------------------------------------------------------------ the job


def _dist():
    return _lt._dist()


def _open(root: Any, kwargs: Dict[str, Any]) -> Checkpointer:
    """The Checkpointer of this process: rank and world from torch.distributed, the
    secret broadcast by rank 0 when there is none (libckpt.torch.open)."""
    kw = dict(kwargs)
    if _dist() is None:
        kw.setdefault("rank", 0)
        kw.setdefault("world", 1)
    if kw.get("read_only"):
        kw.setdefault("no_auth", True)    # a read-only context joins no coordinator
    return _lt.open(root, **kw)


def _agree(ck: Checkpointer, what: str, fn: Callable[[], Any]) -> Any:
    """fn() decided by rank 0 and broadcast to every rank of the default process
    group. Rank 0 broadcasts its failure too, so no rank waits for a value that
    never comes."""
    if ck.world == 1:
        return fn()
    d = _dist()
    if d is None:
        raise ValueError(f"checkpoint root {ck.root}: {what} needs torch.distributed "
                         "initialized when the world has several ranks; pass the step "
                         "(checkpoint_id or step=)")
    box: List[Any] = [None]
    err: Optional[BaseException] = None
    if d.get_rank() == 0:
        try:
            box[0] = ("ok", fn())
        except Exception as e:  # every rank must learn of it
            err = e
            box[0] = ("error", f"{type(e).__name__}: {e}")
    d.broadcast_object_list(box, src=0)
    tag, value = box[0]
    if err is not None:
        raise err
    if tag != "ok":
        raise StateError(f"checkpoint root {ck.root}: rank 0 could not decide {what}: "
                         f"{value}", -1015)
    return value


def _u8_of(data: bytes) -> "torch.Tensor":
    return (torch.frombuffer(bytearray(data), dtype=torch.uint8) if data
            else torch.empty(0, dtype=torch.uint8))


def _bytes_of(t: "torch.Tensor") -> bytes:
    n = t.numel()
    return ctypes.string_at(t.data_ptr(), n) if n else b""


class _Base:
    def __init__(self, root, step, checkpointer, kwargs, what):
        if (root is None) == (checkpointer is None):
            raise TypeError(f"{what} takes a checkpoint root or checkpointer=, one of them")
        if checkpointer is not None and kwargs:
            raise TypeError(f"{what}: Checkpointer options ({', '.join(kwargs)}) go with "
                            "a root, not with checkpointer=")
        self.root = os.fspath(root) if root is not None else checkpointer.root
        self.step = _parse_step(step, "step")
        self._ck: Optional[Checkpointer] = checkpointer
        self._own = checkpointer is None
        self._kwargs = kwargs
        self._id: Optional[int] = None

    @property
    def checkpointer(self) -> Checkpointer:
        """The Checkpointer in use, opened on first use (collectively, on every rank)."""
        if self._ck is None or self._ck.closed:
            if not self._own:
                raise StateError(f"checkpoint root {self.root}: the Checkpointer given "
                                 "to the plugin is closed", -1015)
            self._ck = _open(self.root, self._kwargs)
        return self._ck

    @property
    def checkpoint_id(self) -> Optional[int]:
        return self._id if self._id is not None else self.step

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, os.PathLike, int]) -> bool:
        """True for a step number: an int >= 0 or a string of digits."""
        return _valid_id(checkpoint_id)

    def __getstate__(self):
        # DCP's process-based async executor sends the writer to another process:
        # the root and options travel, the open context does not.
        if not self._own:
            raise TypeError(f"{type(self).__name__} over a given Checkpointer cannot be "
                            "sent to another process; pass the root instead")
        state = dict(self.__dict__)
        for k in ("_ck", "_save", "_pending", "_load", "_plans_seen", "_meta_sent"):
            if k in state:
                state[k] = [] if k == "_pending" else None
        return state

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------ writer


class Writer(_Base, StorageWriter):
    """A DCP StorageWriter saving each checkpoint as one libckpt step of root.

    step: the step when dcp.save gets no checkpoint_id (None: the latest committed
    step + 1). checkpointer: an open Checkpointer to use instead of root (not closed
    here). Other keyword arguments are Checkpointer's (secret=, compress=,
    timeout=, ...). Keep the writer until the next save or close() it: see the
    module's notes on handles."""

    def __init__(self, root: Optional[Union[str, os.PathLike]] = None,
                 step: Optional[int] = None, *,
                 checkpointer: Optional[Checkpointer] = None, **checkpointer_kwargs):
        _Base.__init__(self, root, step, checkpointer, checkpointer_kwargs, "Writer")
        self._save: Optional[Save] = None        # this save's handle
        self._pending: List[Save] = []           # earlier saves' handles, submitted
        self._cur_step: Optional[int] = None
        self._is_coordinator = False
        self._plans_seen: Optional[List[SavePlan]] = None
        self._meta_sent: Optional[Metadata] = None

    # -- DCP's calls, in its order
    def reset(self, checkpoint_id: Union[str, os.PathLike, int, None] = None) -> None:
        """DCP passes checkpoint_id here (dcp.save(..., checkpoint_id=N)); it is used
        by the next save only."""
        self._id = _parse_step(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("use_collectives", True) is False:
            raise NotImplementedError("libckpt.dcp: use_collectives=False (a checkpoint "
                                      "per rank) is not supported; a libckpt step is "
                                      "committed by all ranks together")
        self._drop_unfinished()
        self._is_coordinator = bool(is_coordinator)
        self._plans_seen = None
        self._meta_sent = None
        ck = self.checkpointer
        step = self._id if self._id is not None else self.step
        self._id = None      # reset() is not called by a save without checkpoint_id
        if step is None:
            step = _agree(ck, "the step of this save", lambda: self._next_step(ck))
        self._cur_step = step

    @staticmethod
    def _next_step(ck: Checkpointer) -> int:
        steps = ck.steps(meta=False)
        return steps[-1].step + 1 if steps else 0

    def storage_meta(self) -> Optional[Any]:
        return None

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        # Bad keys and dtypes fail here, before any rank has written anything.
        seen: Dict[str, Any] = {}
        for item in plan.items:
            fqn = item.index.fqn
            name = item_name(fqn)
            if name in seen:
                raise ShapeError(f"DCP key {fqn!r}: this rank holds more than one box of "
                                 "it; libckpt stores one box per rank of a tensor", -1008)
            seen[name] = item
            if item.type != WriteItemType.BYTE_IO and item.tensor_data is not None:
                dtype_code(item.tensor_data.properties.dtype, f"DCP key {fqn!r}")
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        self._plans_seen = plans
        return plans

    def write_data(self, plan: SavePlan,
                   planner: SavePlanner) -> "Future[List[WriteResult]]":
        if self._cur_step is None:
            raise StateError(f"checkpoint root {self.root}: write_data before "
                             "set_up_storage_writer", -1015)
        ck = self.checkpointer
        save = Save(ck, self._cur_step)
        self._save = save
        results: List[WriteResult] = []
        try:
            for item in plan.items:
                results.append(self._add(save, item, planner.resolve_data(item)))
            meta = self._planner_metadata(planner) if self._is_coordinator else None
            if meta is not None:
                self._add_metadata(save, meta)
                self._meta_sent = meta
            if not self._is_coordinator or meta is not None:
                save.submit()
                # This rank's tensors are copied out; the commit goes on in the
                # library's threads and is awaited by the coordinator's finish().
                save.wait_snapshot()
        except BaseException:
            self._save = None
            save.close()       # never submitted: aborts the step on every rank
            raise
        if not self._is_coordinator:
            self._save = None
            self._pending.append(save)
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        save, self._save = self._save, None
        if save is None:
            raise StateError(f"checkpoint root {self.root}: finish without write_data on "
                             "this rank", -1015)
        try:
            sent = self._meta_sent
            if sent is None:
                self._add_metadata(save, metadata)
                save.submit()
            elif sent is not metadata:
                # Only a planner whose create_global_plan is DefaultSavePlanner's takes
                # the early road, and that one returns planner.metadata itself.
                raise StateError(f"step {save.step}: DCP finished with metadata other "
                                 "than its planner's; the step is aborted", -1015)
            save.wait()        # committed on every rank, or raises (AbortedError, ...)
        finally:
            save.close()
            self._meta_sent = None

    # -- the rest
    def _add(self, save: Save, item, data) -> WriteResult:
        fqn = item.index.fqn
        name = item_name(fqn)
        if item.type == WriteItemType.BYTE_IO:
            raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
            save.add(name, _u8_of(raw), kind=_kind_of(fqn, True), policy="sharded")
            return WriteResult(index=item.index, size_in_bytes=len(raw),
                               storage_data={"item": name, "bytes": len(raw)})
        td = item.tensor_data
        t = data.detach()
        if tuple(t.shape) != tuple(td.chunk.sizes):
            raise ShapeError(f"DCP key {fqn!r}: the planner resolved a tensor of shape "
                             f"{tuple(t.shape)} for the chunk {tuple(td.chunk.sizes)}", -1008)
        if t.device.type not in ("cpu", "cuda"):
            t = t.cpu()
        offset = tuple(int(x) for x in td.chunk.offsets)
        save.add(name, t, kind=_kind_of(fqn, False), policy="sharded",
                 global_shape=tuple(int(x) for x in td.size), offset=offset)
        return WriteResult(index=item.index, size_in_bytes=t.numel() * t.element_size(),
                           storage_data={"item": name, "offset": offset})

    def _planner_metadata(self, planner: SavePlanner) -> Optional[Metadata]:
        """The global metadata when it is known already (see the module's notes)."""
        create = getattr(type(planner), "create_global_plan", None)
        if not isinstance(planner, DefaultSavePlanner) or \
                create is not DefaultSavePlanner.create_global_plan:
            return None
        meta = getattr(planner, "metadata", None)
        if not isinstance(meta, Metadata) or self._plans_seen is None or \
                getattr(planner, "global_plan", None) is not self._plans_seen:
            return None      # plan caching, or not this save's plan
        return meta

    def _add_metadata(self, save: Save, metadata: Metadata) -> None:
        fields = {f.name for f in dataclasses.fields(metadata)}
        change: Dict[str, Any] = {}
        if "version" in fields and getattr(metadata, "version", None) is None:
            change["version"] = _DCP_VERSION
        if "storage_meta" in fields and StorageMeta is not None:
            change["storage_meta"] = StorageMeta(checkpoint_id=str(save.step),
                                                 save_id=uuid.uuid4().hex)
        blob = pickle.dumps(dataclasses.replace(metadata, **change) if change else metadata)
        save.add(METADATA_ITEM, _u8_of(blob), kind="extra", policy="sharded")

    def _drop_unfinished(self) -> None:
        # A save DCP gave up on (another rank failed, so finish() never came): one
        # never submitted aborts the step on every rank, which ends the others' too.
        save, self._save = self._save, None
        if save is not None:
            save.close()
        self._free_pending()

    def _free_pending(self) -> None:
        pending, self._pending = self._pending, []
        for s in pending:
            s.close()      # submitted: waits for its outcome, which is known by now

    def close(self) -> None:
        """Free every save handle (waiting for saves in flight; one never submitted
        is aborted on every rank) and close the Checkpointer if the writer opened
        it. Idempotent."""
        self._drop_unfinished()
        if self._own and self._ck is not None:
            self._ck.close()
            self._ck = None


# ------------------------------------------------------------------ reader


class Reader(_Base, StorageReader):
    """A DCP StorageReader loading a libckpt step of root.

    step: the step when dcp.load gets no checkpoint_id (None: the latest committed
    step). checkpointer: an open Checkpointer to use instead of root (not closed
    here). Other keyword arguments are Checkpointer's; the root is opened
    read_only unless read_only=False is given. The step's metadata is a pickle
    written by DCP: load only from roots you trust."""

    def __init__(self, root: Optional[Union[str, os.PathLike]] = None,
                 step: Optional[int] = None, *,
                 checkpointer: Optional[Checkpointer] = None, **checkpointer_kwargs):
        if checkpointer is None:
            checkpointer_kwargs.setdefault("read_only", True)
        _Base.__init__(self, root, step, checkpointer, checkpointer_kwargs, "Reader")
        self._load: Optional[Load] = None
        self.last_error: Optional[BaseException] = None

    def reset(self, checkpoint_id: Union[str, os.PathLike, int, None] = None) -> None:
        self._id = _parse_step(checkpoint_id)
        self._close_load()

    def read_metadata(self) -> Metadata:
        """Open the step and unpickle its DCP metadata. DCP (2.5 and later) hides an
        exception raised here behind 'metadata is None'; the cause is logged on the
        "libckpt.dcp" logger and kept in last_error."""
        try:
            return self._read_metadata()
        except Exception as e:
            self.last_error = e
            _log.error("libckpt.dcp: reading the metadata of %s failed: %s: %s",
                       self.root, type(e).__name__, e)
            raise

    def _read_metadata(self) -> Metadata:
        self._close_load()
        ck = self.checkpointer
        step = self._id if self._id is not None else self.step
        if step is None:
            step = _agree(ck, "the step to load", lambda: self._latest(ck))
        ld = ck.load(step)
        self._load = ld
        info = ld.info(METADATA_ITEM)
        if info.is_blob or info.dtype != "u8" or len(info.shape) != 1:
            raise StateError(f"step {ld.step} of {self.root}: {METADATA_ITEM!r} is not DCP "
                             "metadata; this step was not saved by libckpt.dcp", -1015)
        buf = torch.empty(info.shape[0], dtype=torch.uint8)
        ld.read(METADATA_ITEM, out=buf)
        metadata = pickle.loads(_bytes_of(buf))
        if not isinstance(metadata, Metadata):
            raise StateError(f"step {ld.step} of {self.root}: {METADATA_ITEM!r} holds a "
                             f"{type(metadata).__name__}, not DCP's Metadata", -1015)
        if StorageMeta is not None and hasattr(metadata, "storage_meta"):
            if metadata.storage_meta is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = uuid.uuid4().hex
        return metadata

    @staticmethod
    def _latest(ck: Checkpointer) -> int:
        with ck.load(None) as ld:
            return ld.step

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool,
                              *args: Any, **kwargs: Any) -> None:
        if self._load is None:
            raise StateError(f"checkpoint root {self.root}: set_up_storage_reader before "
                             "read_metadata", -1015)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> "Future[None]":
        ld = self._load
        if ld is None:
            raise StateError(f"checkpoint root {self.root}: read_data before "
                             "read_metadata", -1015)
        batch: List[Tuple[str, Any, Any, Any]] = []
        after: List[Tuple[Any, Any, Any, bool]] = []
        for req in plan.items:
            fqn = req.storage_index.fqn
            name = item_name(fqn)
            info = ld.info(name)
            if req.type == LoadItemType.BYTE_IO:
                buf = torch.empty(info.shape[0] if info.shape else 0, dtype=torch.uint8)
                batch.append((name, buf, None, None))
                after.append((req, None, buf, True))
                continue
            # The box to read, in the global shape: the saved chunk's offset plus the
            # offset within it. libckpt reads it whatever boxes the ranks saved.
            base = req.storage_index.offset or (0,) * len(req.lengths)
            off = tuple(int(a) + int(b) for a, b in zip(base, req.storage_offsets))
            ext = tuple(int(x) for x in req.lengths)
            target = planner.resolve_tensor(req).detach()
            if tuple(target.shape) != ext:
                raise ShapeError(f"DCP key {fqn!r}: the planner resolved a tensor of shape "
                                 f"{tuple(target.shape)} for a read of {ext}", -1008)
            stored = torch_dtype_for(dtype_code(info.dtype))
            direct = target.dtype == stored and target.device.type in ("cpu", "cuda")
            out = target if direct else torch.empty(ext, dtype=stored)
            batch.append((name, out, off, ext))
            after.append((req, target, out, direct))
        if batch:
            ld.read_many(batch)
        for req, target, out, direct in after:
            if target is None:
                planner.load_bytes(req, io.BytesIO(_bytes_of(out)))
                continue
            if not direct:
                target.copy_(out)
            planner.commit_tensor(req, target)
        self._close_load()
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _close_load(self) -> None:
        ld, self._load = self._load, None
        if ld is not None:
            ld.close()

    def close(self) -> None:
        """Close the open step and the Checkpointer if the reader opened it."""
        self._close_load()
        if self._own and self._ck is not None:
            self._ck.close()
            self._ck = None
