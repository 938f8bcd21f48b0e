"""Checkpointer, Save and Load: the Python face of ckpt_open, ckpt_save_* and
ckpt_load_* (include/ckpt/ckpt.h). Each method is one or a few C calls; the library
does the work, in its own threads, with the GIL released while a call blocks."""
from __future__ import annotations

import ctypes
import json
import os
import threading
import weakref
from ctypes import byref, c_int, c_size_t, c_void_p
from dataclasses import dataclass
from typing import (Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence,
                    Tuple, Union)

from . import _lib
from ._lib import LATEST, lib
from .arrays import dtype_code, dtype_name, numpy_dtype_for, view_of
from .errors import StateError, check

__all__ = ["Checkpointer", "Save", "Load", "StepInfo", "ItemInfo", "KINDS", "POLICIES",
           "LATEST"]

KINDS = {"model": 1, "optimizer": 2, "rng": 3, "scheduler": 4, "extra": 5}
POLICIES = {"sharded": 1, "replicated": 2, "rank-bound": 3}
_KIND_NAMES = {v: k for k, v in KINDS.items()}
_POLICY_NAMES = {v: k for k, v in POLICIES.items()}
_STATES = {1: "committed", 2: "aborted", 3: "inflight"}
_TRUST = {0: None, 1: "committed", 2: "verified"}

# enum ckpt_open_flags
_OPEN_READONLY, _OPEN_NO_GC, _OPEN_GROUP_ACCESS, _OPEN_NO_AUTH = 1, 2, 8, 16
_TRANSPORTS = {None: 0, "auto": 0, "tcp": 1, "rdma": 2}
_GDS = {"load": 1, "save": 2, "off": 128}
_CODEC_ZSTD, _CODEC_BYTEGROUP = 1, 2       # enum ckpt_codec
_LOG_LEVELS = {"error": 0, "warn": 1, "info": 2, "debug": 3}


def _kind(kind: Union[str, int]) -> int:
    if isinstance(kind, int) and kind in _KIND_NAMES:
        return kind
    if isinstance(kind, str) and kind in KINDS:
        return KINDS[kind]
    raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")


def _policy(policy: Union[str, int]) -> int:
    if isinstance(policy, str):
        policy = policy.replace("_", "-")
        if policy in POLICIES:
            return POLICIES[policy]
    elif isinstance(policy, int) and policy in _POLICY_NAMES:
        return policy
    raise ValueError(f"policy {policy!r}: one of {', '.join(POLICIES)}")


def _name(name: str, what: str = "name") -> bytes:
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, got {type(name).__name__}")
    try:
        return name.encode("utf-8")
    except UnicodeEncodeError as e:
        from .errors import InvalidNameError
        raise InvalidNameError(f"{what} {name!r} is not valid UTF-8: {e.reason}",
                               -1007) from None


def _timeout_ms(timeout: Optional[float]) -> int:
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError("timeout must be None (forever) or >= 0 seconds")
    return min(int(timeout * 1000), 2**31 - 1)


def _step_arg(step: Optional[int]) -> int:
    if step is None:
        return LATEST
    step = int(step)
    if not 0 <= step < LATEST:
        raise ValueError(f"step {step} is outside 0 .. 2**64-2")
    return step


def _flag(what: str, v: Any) -> bool:
    """A switch given as a bool (or 0 / 1): anything else is a mistake, not a truth
    value (incremental="no" would otherwise turn it on)."""
    if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
        return bool(v)
    raise TypeError(f"{what} must be True or False, got {v!r}")


def _meta_text(meta: Union[Mapping[str, Any], str, bytes]) -> bytes:
    if isinstance(meta, Mapping):
        return json.dumps(meta, allow_nan=False, separators=(",", ":")).encode()
    if isinstance(meta, str):
        return meta.encode("utf-8")
    if isinstance(meta, (bytes, bytearray)):
        return bytes(meta)
    raise TypeError(f"meta must be a dict or a JSON object's text, got "
                    f"{type(meta).__name__}")


@dataclass
class StepInfo:
    """One step of a root (struct ckpt_step_info), with its user metadata."""
    step: int
    state: str                  # "committed", "aborted" or "inflight"
    trust: Optional[str]        # "committed", "verified", or None without a record
    world: int
    ntensors: int
    logical_bytes: int
    stored_bytes: int
    commit_time: Optional[float]  # seconds since the epoch; None before a commit
    has_record: bool
    has_dir: bool
    nfiles: int
    dir_bytes: int
    meta: Optional[Dict[str, Any]] = None


@dataclass
class ItemInfo:
    """One tensor or blob of an opened step (struct ckpt_tensor_info)."""
    name: str
    kind: str
    dtype: str
    policy: str
    shape: Tuple[int, ...]
    is_blob: bool
    nshards: int
    nchunks: int
    logical_bytes: int
    stored_bytes: int


@dataclass
class SaveStats:
    logical_bytes: int
    stored_bytes: int
    snapshot_seconds: float
    durable_seconds: float
    commit_seconds: float
    referenced_bytes: int = 0        # not written: references to the previous step
    device_staged_bytes: int = 0     # copied into the device staging pool
    device_unchanged_bytes: int = 0  # found unchanged there: not copied, not written


_PY_LEVELS = {0: 40, 1: 30, 2: 20, 3: 10}     # logging.ERROR, WARNING, INFO, DEBUG


def _log_callback(log: Any):
    """A ckpt_log_fn that hands each line of the context to log: a logging.Logger
    (the line at the matching level, with the job, rank and step as `extra`
    ckpt_job, ckpt_rank, ckpt_step), or any callable(level_name, message, where)."""
    import logging
    names = {0: "error", 1: "warn", 2: "info", 3: "debug"}

    def line(_arg, level, where, msg):
        try:
            text = (msg or b"").decode("utf-8", "replace")
            w = where.contents if where else None
            ctx = {"ckpt_job": (w.job_id or b"").decode("utf-8", "replace") if w else "",
                   "ckpt_rank": w.rank if w else -1,
                   "ckpt_step": None if not w or w.step == LATEST else w.step}
            if isinstance(log, logging.Logger):
                log.log(_PY_LEVELS.get(level, 10), "%s", text, extra=ctx)
            else:
                log(names.get(level, "debug"), text, ctx)
        except Exception:       # never let an exception cross into the library's thread
            pass

    if not (isinstance(log, logging.Logger) or callable(log)):
        raise TypeError("log: a logging.Logger or a callable(level, message, where)")
    return _lib.LOG_FN(line)


class _Closing:
    """A context manager whose exit, and whose collection, close it."""

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class _Handle(_Closing):
    """A handle that the Checkpointer's close() releases first."""

    def _release(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def close(self) -> None:
        self._release()


def _compress_opts(compress: Union[int, str]) -> Tuple[int, int]:
    """compress= as (zstd_level, compress_codec): an int is a zstd level (1..22; 0 raw;
    -1 CKPT_COMPRESS); a string is what CKPT_COMPRESS takes: "none",
    "zstd[:LEVEL]" or "bytegroup[:LEVEL]"."""
    if isinstance(compress, bool) or not isinstance(compress, (int, str)):
        raise TypeError(f"compress={compress!r}: a zstd level or a codec name")
    if isinstance(compress, int):
        return int(compress), _CODEC_ZSTD
    name, _, level = compress.partition(":")
    defaults = {"none": (0, _CODEC_ZSTD), "zstd": (3, _CODEC_ZSTD),
                "bytegroup": (1, _CODEC_BYTEGROUP)}
    if name not in defaults or (name == "none" and level):
        raise ValueError(f"compress={compress!r}: none, zstd[:LEVEL] or bytegroup[:LEVEL]")
    lvl, codec = defaults[name]
    if level:
        if not level.isdigit() or not 1 <= int(level) <= 22:
            raise ValueError(f"compress={compress!r}: LEVEL is 1 to 22")
        lvl = int(level)
    return lvl, codec


class Checkpointer(_Closing):
    """An open checkpoint root (a ckpt_ctx): saves and loads of this rank.

    Options default to the environment exactly as the C library's do (CKPT_ROOT,
    RANK/WORLD_SIZE, MASTER_ADDR, CKPT_JOB_SECRET, ... : docs/api.md); pass a value
    to override. With several ranks every rank opens the root and the call returns
    when all of them have reached the coordinator (rank 0). Use as a context
    manager, or call close().

    manifest_dir: where the manifest lives when it is kept apart from the root (an
    absolute path; default CKPT_MANIFEST_DIR, then <root>/manifest): on rank 0's
    local disk while the shards go to a shared file system (docs/operations.md,
    "Multi-node deployments"). target: "ckptd://HOST:PORT[,HOST:PORT...]" to save
    through ckptd (default CKPT_TARGET), passed to the library as it is.

    incremental: True makes saves reference the chunks that did not change since the
    previous committed step instead of writing them again (docs/format.md §3b); such
    a step's files are no longer self-contained. Default CKPT_INCREMENTAL, then off;
    one save may choose otherwise (save(incremental=), Save.set_incremental).

    device_pool_bytes: a staging pool of that many bytes of the save tensors' GPU
    memory (default CKPT_DEVICE_POOL_BYTES, then none): a save copies its CUDA
    tensors there, device to device, so they may change again after those copies
    (docs/gpu.md, "Device staging pool").

    log: a logging.Logger that receives this context's log lines instead of stderr
    (at the matching level, with ckpt_job, ckpt_rank and ckpt_step as extra
    attributes), or a callable(level, message, where); log_level filters them
    ("error", "warn", "info", "debug"; default CKPT_LOG, then "warn").
    """

    def __init__(self, root: Optional[Union[str, os.PathLike]] = None, *,
                 rank: Optional[int] = None, world: Optional[int] = None,
                 job_id: Optional[str] = None,
                 secret: Optional[Union[bytes, str]] = None,
                 coord_addr: Optional[str] = None, coord_port: Optional[int] = None,
                 transport: Optional[str] = None,
                 pool_bytes: Optional[int] = None, chunk_bytes: Optional[int] = None,
                 compress: Optional[Union[int, str]] = None,
                 compress_threads: Optional[int] = None,
                 max_inflight: Optional[int] = None,
                 timeout: Optional[float] = None, queue_depth: Optional[int] = None,
                 gds: Optional[Sequence[str]] = None,
                 read_only: bool = False, no_gc: bool = False,
                 group_access: bool = False, no_auth: bool = False,
                 log_level: Optional[str] = None, log: Any = None,
                 keep_last: Optional[int] = None, keep_every: Optional[int] = None,
                 keep_seconds: Optional[float] = None,
                 manifest_dir: Optional[Union[str, os.PathLike]] = None,
                 target: Optional[str] = None, incremental: Optional[bool] = None,
                 device_pool_bytes: Optional[int] = None):
        self._ctx: Optional[int] = None
        self._lock = threading.Lock()
        self._handles: "weakref.WeakSet[Any]" = weakref.WeakSet()
        o = _lib.Opts()
        lib.ckpt_opts_init(byref(o), ctypes.sizeof(o))
        keep = []  # bytes objects the C struct points at, alive through ckpt_open
        if root is not None:
            r = os.fsencode(root)
            keep.append(r)
            o.root = r
        if manifest_dir is not None:
            md = os.fsencode(manifest_dir)
            keep.append(md)
            o.manifest_dir = md
        if target is not None:
            t = target.encode()
            keep.append(t)
            o.target = t
        o.flags = ((_OPEN_READONLY if read_only else 0) | (_OPEN_NO_GC if no_gc else 0)
                   | (_OPEN_GROUP_ACCESS if group_access else 0)
                   | (_OPEN_NO_AUTH if no_auth else 0))
        if rank is not None:
            o.rank = int(rank)
        if world is not None:
            o.world = int(world)
        if coord_addr is not None:
            o.coord_addr = coord_addr.encode()
            keep.append(o.coord_addr)
        if coord_port is not None:
            o.coord_port = int(coord_port)
        if transport not in _TRANSPORTS:
            raise ValueError(f"transport {transport!r}: tcp, rdma or auto")
        o.transport = _TRANSPORTS[transport]
        if job_id is not None:
            o.job_id = job_id.encode()
            keep.append(o.job_id)
        if secret is not None:
            sb = secret.encode() if isinstance(secret, str) else bytes(secret)
            if not sb:
                raise ValueError("secret must not be empty")
            buf = ctypes.create_string_buffer(sb, len(sb))
            keep.append(buf)
            o.secret = ctypes.cast(buf, c_void_p)
            o.secret_len = len(sb)
        for fname, val in (("pool_bytes", pool_bytes), ("chunk_bytes", chunk_bytes),
                           ("device_pool_bytes", device_pool_bytes),
                           ("max_inflight", max_inflight),
                           ("queue_depth", queue_depth)):
            if val is not None:
                if int(val) <= 0:
                    raise ValueError(f"{fname} must be positive")
                setattr(o, fname, int(val))
        if compress is not None:
            o.zstd_level, o.compress_codec = _compress_opts(compress)
        if compress_threads is not None:
            if not 1 <= int(compress_threads) <= 64:
                raise ValueError("compress_threads must be 1 to 64")
            o.compress_threads = int(compress_threads)
        if incremental is not None:   # None: -1, CKPT_INCREMENTAL then off
            o.incremental = 1 if _flag("incremental", incremental) else 0
        if timeout is not None:
            o.timeout_ms = max(1, int(timeout * 1000))
        if gds is not None:
            bits = 0
            for g in ([gds] if isinstance(gds, str) else gds):
                if g not in _GDS:
                    raise ValueError(f"gds {g!r}: load, save or off")
                bits |= _GDS[g]
            o.gds = bits
        if log_level is not None:
            if log_level not in _LOG_LEVELS:
                raise ValueError(f"log_level {log_level!r}: {', '.join(_LOG_LEVELS)}")
            o.log_level = _LOG_LEVELS[log_level]
        self._log_cb = None
        if log is not None:
            self._log_cb = _log_callback(log)
            o.log_fn = ctypes.cast(self._log_cb, c_void_p)
        keeps = {"keep_last": keep_last, "keep_every": keep_every,
                 "keep_seconds": keep_seconds}
        if any(v is not None for v in keeps.values()):
            for fname, val in keeps.items():
                if val is not None:
                    if val < 0:
                        raise ValueError(f"{fname} must be >= 0")
                    setattr(o, fname, int(val))
        ctx = c_void_p()
        rc = lib.ckpt_open(byref(o), byref(ctx))
        del keep
        check(rc)
        self._ctx = ctx.value
        self.root = os.fsdecode(root) if root is not None else os.environ.get("CKPT_ROOT")
        self.rank: int = lib.ckpt_rank(self._ctx)
        self.world: int = lib.ckpt_world(self._ctx)
        self.read_only = read_only

    # -- life
    def close(self) -> None:
        """Finish every save still in flight (waiting for it), close every open step,
        then close the root. Idempotent."""
        with self._lock:
            ctx, self._ctx = self._ctx, None
            handles = list(self._handles)
        if ctx is None:
            return
        for h in handles:
            h._release()
        lib.ckpt_close(ctx)

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def _c(self) -> int:
        ctx = self._ctx
        if ctx is None:
            raise StateError(f"checkpoint root {self.root}: the Checkpointer is closed",
                             -1015)
        return ctx

    def _track(self, h) -> None:
        with self._lock:
            self._handles.add(h)

    @property
    def cuda_available(self) -> bool:
        return lib.ckpt_cuda_available(self._c()) == 1

    # -- saving
    def begin(self, step: int) -> "Save":
        """Begin a save of step on this rank (ckpt_save_begin); add items, then submit."""
        return Save(self, step)

    def save(self, step: int, tensors: Optional[Mapping[str, Any]] = None, *,
             blobs: Optional[Mapping[str, Any]] = None, kind: str = "model",
             policy: str = "replicated", meta: Optional[Mapping[str, Any]] = None,
             wait: bool = False, incremental: Optional[bool] = None) -> "Save":
        """Save whole arrays and blobs as step in one call; returns the submitted Save.
        Every tensor is saved whole with the given kind and policy (for boxes of sharded
        tensors use begin() and Save.add). wait=True also waits for the commit.
        incremental: this save's choice (Save.set_incremental); None: the root's."""
        def fill(s: Save) -> None:
            if incremental is not None:
                s.set_incremental(incremental)
            for name, arr in (tensors or {}).items():
                s.add(name, arr, kind=kind, policy=policy)
            for name, data in (blobs or {}).items():
                s.add_blob(name, data, kind=kind if kind != "model" else "extra",
                           policy="rank-bound" if policy == "rank-bound" else "replicated")
        return Save(self, step).fill_and_submit(fill, meta=meta, wait=wait)

    # -- steps
    def steps(self, all: bool = False, meta: bool = True) -> List[StepInfo]:
        """The committed steps in ascending order; all=True: also aborted and in-flight
        records and step directories without one. meta: read each step's metadata."""
        ctx = self._c()
        flags = 1 if all else 0
        size = ctypes.sizeof(_lib.StepInfo)
        while True:
            n = check(lib.ckpt_steps(ctx, flags, None, 0, size))
            arr = (_lib.StepInfo * max(n, 1))()
            m = check(lib.ckpt_steps(ctx, flags, arr, n, size))
            if m <= n:
                break
        return [self._step_info(arr[i], meta) for i in range(m)]

    def step(self, step: Optional[int] = None) -> StepInfo:
        """One step, whatever its state; None: the latest committed step."""
        si = _lib.StepInfo()
        check(lib.ckpt_step_info(self._c(), _step_arg(step), byref(si), ctypes.sizeof(si)))
        return self._step_info(si, True)

    @property
    def latest(self) -> Optional[int]:
        """The latest committed step, or None when there is none."""
        si = _lib.StepInfo()
        rc = lib.ckpt_step_info(self._c(), LATEST, byref(si), ctypes.sizeof(si))
        if rc == -1004:
            return None
        check(rc)
        return si.step

    def meta(self, step: Optional[int] = None) -> Optional[Dict[str, Any]]:
        """The user metadata stored with step (None: latest), or None if it has none."""
        if not _lib.has("ckpt_step_meta"):
            return None
        ctx = self._c()
        st = _step_arg(step)
        n = c_size_t(0)
        cap = 4096
        while True:
            buf = ctypes.create_string_buffer(cap)
            rc = lib.ckpt_step_meta(ctx, st, buf, cap, byref(n))
            if rc == -28 and n.value + 1 > cap:   # -ENOSPC
                cap = n.value + 1
                continue
            check(rc)
            break
        if n.value == 0:
            return None
        return json.loads(buf.raw[:n.value].decode("utf-8"))

    def _step_info(self, si, with_meta: bool) -> StepInfo:
        info = StepInfo(
            step=si.step, state=_STATES.get(si.state, str(si.state)),
            trust=_TRUST.get(si.trust), world=si.world, ntensors=si.ntensors,
            logical_bytes=si.logical_bytes, stored_bytes=si.stored_bytes,
            commit_time=si.commit_time_ns / 1e9 if si.commit_time_ns else None,
            has_record=bool(si.has_record), has_dir=bool(si.has_dir),
            nfiles=si.nfiles, dir_bytes=si.dir_bytes)
        if with_meta and si.has_record and si.state == 1:
            info.meta = self.meta(si.step)
        return info

    # -- loading
    def load(self, step: Optional[int] = None) -> "Load":
        """Open a committed step for reading (None: the latest)."""
        return Load(self, step)


class Save(_Handle):
    """A save of one step on this rank (a ckpt_save).

    add()/add_blob()/set_meta(), then submit(): the save runs in the library's
    threads. wait_snapshot() returns when every byte has been copied out of the
    caller's arrays (they may change from then on); wait() when the step is durable
    and committed on every rank, raising AbortedError, InDoubtError, ... otherwise.
    The arrays added are kept alive by the handle until the snapshot point.
    """

    def __init__(self, ck: Checkpointer, step: int):
        self._ck = ck
        self.step = _step_arg(step)
        if self.step == LATEST:
            raise ValueError("step None: a save needs a step number")
        h = c_void_p()
        check(lib.ckpt_save_begin(ck._c(), self.step, byref(h)))
        self._h: Optional[int] = h.value
        self._keep: List[Any] = []
        self._streams: set = set()
        self._submitted = False
        self._outcome: Optional[int] = None
        self._snap = False
        self._cuda_device: Optional[int] = None
        ck._track(self)

    def _s(self) -> int:
        h = self._h
        if h is None:
            raise StateError(f"save of step {self.step}: the handle is closed", -1015)
        return h

    def add(self, name: str, array: Any, *, kind: Union[str, int] = "model",
            policy: Union[str, int] = "replicated",
            global_shape: Optional[Sequence[int]] = None,
            offset: Optional[Sequence[int]] = None, dtype: Any = None) -> None:
        """Add this rank's box of a tensor: array (numpy, or torch on CPU or CUDA) is
        the box; offset (default zeros) places it in global_shape (default: the
        array's shape). dtype overrides the element type for raw-bit arrays (a uint16
        array of bf16 bits: dtype="bf16")."""
        s = self._s()
        bname = _name(name, "tensor name")
        v = view_of(array, name, dtype)
        shape = tuple(int(x) for x in (global_shape if global_shape is not None
                                        else v.shape))
        if len(shape) != len(v.shape):
            from .errors import ShapeError
            raise ShapeError(f"tensor {name!r}: global shape {shape} and box "
                             f"{v.shape} differ in rank", -1008)
        t = _lib.Tensor()
        t.name = bname
        t.kind = _kind(kind)
        t.dtype = v.dtype
        t.policy = _policy(policy)
        t.ndim = len(shape)
        gs = _lib.u64_array(shape)
        ext = _lib.u64_array(v.shape)
        off = _lib.u64_array(offset) if offset is not None else None
        if offset is not None and len(offset) != len(shape):
            from .errors import ShapeError
            raise ShapeError(f"tensor {name!r}: offset {tuple(offset)} has "
                             f"{len(offset)} dimensions, the shape {len(shape)}", -1008)
        t.global_shape = gs
        t.extent = ext
        if off is not None:
            t.offset = off
        t.data = v.ptr if v.nbytes else None
        t.mem = 2 if v.device else 1
        if v.device:
            if self._cuda_device is None:
                self._cuda_device = v.cuda_device
            elif self._cuda_device != v.cuda_device:
                raise ValueError(f"tensor {name!r} is on cuda:{v.cuda_device}, the save's "
                                 f"other tensors on cuda:{self._cuda_device}: one device "
                                 "per save")
        check(lib.ckpt_save_add_tensor(s, byref(t)))
        self._keep.append(v.keep)

    def add_blob(self, name: str, data: Any, *, kind: Union[str, int] = "extra",
                 policy: Union[str, int] = "replicated") -> None:
        """Add opaque bytes (bytes, bytearray, memoryview, or any buffer);
        policy "replicated" or "rank-bound"."""
        s = self._s()
        bname = _name(name, "blob name")
        mv = memoryview(data).cast("B") if not isinstance(data, bytes) else None
        if isinstance(data, bytes):
            buf = data
            ptr = ctypes.cast(ctypes.c_char_p(buf), c_void_p).value
            n = len(buf)
            keep: Any = buf
        else:
            if not mv.contiguous:
                raise ValueError(f"blob {name!r}: the buffer is not contiguous")
            keep = bytes(mv) if mv.readonly else mv
            if isinstance(keep, bytes):
                ptr = ctypes.cast(ctypes.c_char_p(keep), c_void_p).value
            else:
                ptr = ctypes.addressof(ctypes.c_char.from_buffer(keep)) if len(keep) else 0
            n = len(keep)
        check(lib.ckpt_save_add_blob(s, bname, _kind(kind), _policy(policy),
                                     ptr if n else None, n))
        self._keep.append(keep)

    def set_meta(self, meta: Union[Mapping[str, Any], str, bytes]) -> None:
        """Attach user metadata (a JSON object: a dict, or its text) to the step; the
        step keeps rank 0's."""
        if not _lib.has("ckpt_save_set_meta"):
            raise NotImplementedError("this libckpt cannot store step metadata")
        text = _meta_text(meta)
        check(lib.ckpt_save_set_meta(self._s(), text, len(text)))

    def set_incremental(self, on: bool) -> None:
        """Whether this save references the chunks unchanged since the previous
        committed step instead of writing them (ckpt_save_set_incremental); the default
        is the Checkpointer's. Before submit()."""
        if not _lib.has("ckpt_save_set_incremental"):
            raise NotImplementedError("this libckpt cannot save incrementally")
        check(lib.ckpt_save_set_incremental(self._s(), 1 if _flag("incremental", on) else 0))

    def fill_and_submit(self, fill: "Callable[[Save], None]",
                        meta: Optional[Mapping[str, Any]] = None,
                        wait: bool = False) -> "Save":
        """fill(self) adds the items, then the metadata is set and the save submitted;
        when any of it raises, the save is closed (aborting the step on every rank)
        and the exception goes on. wait=True also waits for the commit."""
        try:
            fill(self)
            if meta is not None:
                self.set_meta(meta)
            self.submit()
        except BaseException:
            self.close()
            raise
        if wait:
            self.wait()
        return self

    def submit(self) -> "Save":
        """Queue the save (returns at once). CUDA tensors are copied after the work
        queued on the current stream of their device before this call."""
        s = self._s()
        if self._cuda_device is not None and not self._submitted:
            import torch
            stream = torch.cuda.current_stream(self._cuda_device)
            check(lib.ckpt_save_set_stream(s, c_void_p(stream.cuda_stream)))
        check(lib.ckpt_save_submit(s))
        self._submitted = True
        return self

    def wait_snapshot(self, timeout: Optional[float] = None) -> None:
        """Block until the caller's arrays may change (the snapshot point)."""
        check(lib.ckpt_save_wait_snapshot(self._s(), _timeout_ms(timeout)))
        self._snap = True
        self._keep = []

    def wait(self, timeout: Optional[float] = None) -> SaveStats:
        """Block until the step is committed (returns its stats) or failed (raises)."""
        rc = lib.ckpt_save_wait(self._s(), _timeout_ms(timeout))
        # -ETIMEDOUT: the save goes on. Not submitted (CKPT_ESTATE): there is no
        # outcome yet, and the arrays added must stay alive for the submit to come.
        if rc != -110 and self._submitted:
            self._outcome = rc
            self._keep = []
        check(rc)
        return self.stats()

    def done(self) -> bool:
        """True once the save has finished, committed or failed (wait() then says)."""
        if self._outcome is not None:
            return True
        if not self._submitted:
            return False
        rc = lib.ckpt_save_wait(self._s(), 0)
        if rc == -110:
            return False
        self._outcome = rc
        self._keep = []
        return True

    def stats(self) -> SaveStats:
        st = _lib.SaveStats()
        st.size = ctypes.sizeof(st)
        check(lib.ckpt_save_stats(self._s(), byref(st)))
        return SaveStats(st.logical_bytes, st.stored_bytes, st.snapshot_seconds,
                         st.durable_seconds, st.commit_seconds, st.referenced_bytes,
                         st.device_staged_bytes, st.device_unchanged_bytes)

    def close(self) -> None:
        """Free the handle: a submitted save is waited for first, an unsubmitted one
        is aborted on every rank."""
        self._release()

    def _release(self) -> None:
        h, self._h = self._h, None
        if h is not None:
            lib.ckpt_save_free(h)
        self._keep = []



class Load(_Handle):
    """An opened committed step (a ckpt_load): list its items, read any box of any
    tensor whatever sharding it was saved with, read blobs."""

    def __init__(self, ck: Checkpointer, step: Optional[int]):
        self._ck = ck
        h = c_void_p()
        check(lib.ckpt_load_open(ck._c(), _step_arg(step), byref(h)))
        self._h: Optional[int] = h.value
        self.step: int = lib.ckpt_load_step(self._h)
        ck._track(self)
        n = check(lib.ckpt_load_count(self._h))
        self._items: Dict[str, ItemInfo] = {}
        self._index: Dict[str, int] = {}
        ti = _lib.TensorInfo()
        for i in range(n):
            check(lib.ckpt_load_info(self._h, i, byref(ti), ctypes.sizeof(ti)))
            name = ti.name.decode("utf-8", "surrogateescape")
            self._index[name] = i
            self._items[name] = ItemInfo(
                name=name, kind=_KIND_NAMES.get(ti.kind, "?"),
                dtype=dtype_name(ti.dtype), policy=_POLICY_NAMES.get(ti.policy, "?"),
                shape=tuple(ti.global_shape[d] for d in range(ti.ndim)),
                is_blob=lib.ckpt_load_is_blob(self._h, i) == 1,
                nshards=ti.nshards, nchunks=ti.nchunks,
                logical_bytes=ti.logical_bytes, stored_bytes=ti.stored_bytes)

    def _l(self) -> int:
        h = self._h
        if h is None:
            raise StateError(f"step {self.step}: the Load is closed", -1015)
        return h

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def names(self) -> List[str]:
        return list(self._items)

    def info(self, name: str) -> ItemInfo:
        try:
            return self._items[name]
        except KeyError:
            from .errors import NotFoundError
            raise NotFoundError(f"step {self.step}: no tensor or blob {name!r}",
                                -1004) from None

    def items(self) -> List[ItemInfo]:
        return list(self._items.values())

    def read(self, name: str, out: Any = None, *, offset: Optional[Sequence[int]] = None,
             extent: Optional[Sequence[int]] = None, dtype: Any = None,
             saved_rank: Optional[int] = None) -> Any:
        """Read the box [offset, offset+extent) of tensor name (default: all of it).

        out: a numpy array or torch tensor (CPU or CUDA) of the box's shape and the
        stored dtype, filled in place and returned; without it a new numpy array
        (bf16 and fp8 come back as raw bits, uint16 and uint8, unless ml_dtypes is
        imported). saved_rank: for a rank-bound item, the rank whose copy to read."""
        return self.read_many([(name, out, offset, extent)], dtype=dtype,
                              saved_rank=saved_rank)[0]

    def read_many(self, requests: Sequence[Tuple[str, Any, Optional[Sequence[int]],
                                                 Optional[Sequence[int]]]], *,
                  dtype: Any = None, saved_rank: Optional[int] = None) -> List[Any]:
        """Several reads as one batch (ckpt_load_tensors): requests of
        (name, out or None, offset or None, extent or None). Raises the first
        failure; the others still load."""
        h = self._l()
        reqs = (_lib.LoadReq * max(len(requests), 1))()
        keep: List[Any] = []
        results_out: List[Any] = []
        fixups: List[Tuple[Any, Any]] = []
        cuda_sync = set()
        for i, (name, out, offset, extent) in enumerate(requests):
            info = self.info(name)
            nd = len(info.shape)
            off = tuple(int(x) for x in offset) if offset is not None else (0,) * nd
            ext = (tuple(int(x) for x in extent) if extent is not None else
                   tuple(s - o for s, o in zip(info.shape, off)))
            # The library reads ndim entries of each: a shorter tuple would have it
            # read past the array, a longer one be cut short without a word.
            if len(off) != nd or len(ext) != nd:
                from .errors import ShapeError
                raise ShapeError(f"tensor {name!r} of step {self.step}: offset {off} and "
                                 f"extent {ext} need {nd} dimensions, the tensor's shape "
                                 f"{info.shape}", -1008)
            if any(x < 0 for x in off + ext):
                from .errors import ShapeError
                raise ShapeError(f"tensor {name!r} of step {self.step}: the box at "
                                 f"{off} of extent {ext} is outside the shape "
                                 f"{info.shape}", -1008)
            code = dtype_code(dtype, f"tensor {name!r}") if dtype is not None else \
                _dtype_code_of(info.dtype)
            target = out
            if out is None:
                import numpy as np
                target = np.empty(ext, dtype=numpy_dtype_for(code))
            elif tuple(_shape_of(out)) != ext:
                from .errors import ShapeError
                raise ShapeError(f"tensor {name!r} of step {self.step}: out has shape "
                                 f"{tuple(_shape_of(out))}, the box {ext}", -1008)
            buf = target
            if not _contiguous(target):
                buf = _empty_like(target)
                fixups.append((target, buf))
            v = view_of(buf, name, dtype=_dtype_override(buf, code), writable=True)
            if v.dtype != code:
                from .errors import DTypeError
                raise DTypeError(f"tensor {name!r} of step {self.step}: out is "
                                 f"{dtype_name(v.dtype)}, the request {dtype_name(code)}",
                                 -1009)
            if v.device:
                cuda_sync.add(v.cuda_device)
            bname = _name(name)
            o_arr, e_arr = _lib.u64_array(off), _lib.u64_array(ext)
            keep += [bname, o_arr, e_arr, v]
            r = reqs[i]
            r.name = bname
            r.dtype = code
            r.ndim = nd
            r.offset = o_arr
            r.extent = e_arr
            r.dst = v.ptr if v.nbytes else None
            r.mem = 2 if v.device else 1
            r.saved_rank = -1 if saved_rank is None else int(saved_rank)
            r.flags = 0
            results_out.append(target)
        if cuda_sync:
            import torch
            for d in cuda_sync:  # the reads land after what the caller queued before
                torch.cuda.current_stream(d).synchronize()
        res = (c_int * max(len(requests), 1))()
        rc = lib.ckpt_load_tensors(h, reqs, len(requests), res)
        check(rc)
        for target, buf in fixups:
            _copy_into(target, buf)
        return results_out

    def blob(self, name: str, saved_rank: Optional[int] = None) -> bytes:
        """A blob's bytes: replicated, this rank's rank-bound one, or saved_rank's."""
        h = self._l()
        bname = _name(name, "blob name")
        n = c_size_t(0)
        cap = max(self._items[name].logical_bytes if name in self._items else 0, 1)
        for _ in range(3):
            buf = ctypes.create_string_buffer(cap)
            if saved_rank is None:
                rc = lib.ckpt_load_blob(h, bname, buf, cap, byref(n))
            else:
                rc = lib.ckpt_load_blob_rank(h, bname, int(saved_rank), buf, cap, byref(n))
            if rc == -28 and n.value > cap:
                cap = n.value
                continue
            check(rc)
            return buf.raw[:n.value]
        check(rc)
        return b""

    def _release(self) -> None:
        h, self._h = self._h, None
        if h is not None:
            lib.ckpt_load_close(h)



def _dtype_code_of(name: str) -> int:
    from .arrays import DTYPES
    return DTYPES[name]


def _shape_of(obj) -> Tuple[int, ...]:
    return tuple(obj.shape)


def _contiguous(obj) -> bool:
    if hasattr(obj, "is_contiguous"):
        return obj.is_contiguous()
    return bool(obj.flags.c_contiguous)


def _empty_like(obj):
    if hasattr(obj, "is_contiguous"):
        import torch
        return torch.empty(tuple(obj.shape), dtype=obj.dtype, device=obj.device)
    import numpy as np
    return np.empty(obj.shape, dtype=obj.dtype)


def _copy_into(target, buf) -> None:
    if hasattr(target, "copy_"):
        target.copy_(buf)
    else:
        target[...] = buf


def _dtype_override(buf, code: int):
    """Raw-bit numpy buffers (uint16 for bf16, uint8 for fp8) read as the stored type."""
    if hasattr(buf, "is_contiguous"):
        return None
    from .arrays import dtype_size
    if buf.dtype.name in ("uint16", "uint8") and dtype_name(code) in ("bf16", "f8_e4m3",
                                                                        "f8_e5m2"):
        if buf.itemsize == dtype_size(code):
            return code
    return None
