"""Whole training states to and from libckpt: model, optimizer, LR scheduler, RNG
state, step and any nested Python values, on one rank or many.

    import libckpt.torch as lt
    ck = lt.open("/ckpt/job")                      # rank, world, secret from torch.distributed
    state = {"model": model, "optim": opt, "sched": sched, "rng": lt.RNGState(), "step": step}
    h = lt.save(ck, step, state, meta={"loss": loss})
    h.wait_snapshot()                              # training may go on
    ...
    lt.load(ck, state)                             # in place, any world size, any sharding

The top-level keys of state each become one part of the step, saved with a kind
(model, optimizer, scheduler, rng, extra: from the key or the object's type) and a
policy (docs/python.md):
  - an object with state_dict()/load_state_dict() (the Stateful protocol of
    torch.distributed.checkpoint: modules, optimizers, schedulers) is saved through
    its state_dict and loaded through its load_state_dict;
  - a DTensor (FSDP2, tensor parallel) is saved as its local shard, a box of a
    sharded tensor whose offset and extent come from its placements; loads read the
    box the destination's placements ask for, whatever the saved sharding was;
  - a plain tensor is one whole replicated value, written by one rank of the job
    (the ranks share the writing by size);
  - the parts named in rank_bound (default: the "rng" kind) are each rank's own;
  - plain values (None, bool, int, float, str, bytes, lists, tuples, dicts with str
    or int keys, torch.dtype, torch.Size, numpy arrays) are stored as data in the
    part's structure record, never pickled unless the caller allows it.
"""
from __future__ import annotations

import base64
import json
import os
import random
import sys
from typing import (Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple,
                    Union)

import torch as _torch

from .arrays import dtype_code, dtype_name, numpy_dtype_for, torch_dtype_for
from .core import Checkpointer, Load, Save
from .errors import (DTypeError, NotFoundError, RankBoundError, ShapeError)

__all__ = ["open", "save", "load", "RNGState", "STRUCTURE_PREFIX"]

STRUCTURE_PREFIX = ".libckpt/structure/"
_FORMAT = 1

_KIND_BY_KEY = {
    "model": "model", "models": "model", "module": "model",
    "optim": "optimizer", "optimizer": "optimizer", "optimizers": "optimizer",
    "sched": "scheduler", "scheduler": "scheduler", "lr_scheduler": "scheduler",
    "rng": "rng", "rng_state": "rng", "rng_states": "rng",
}


# ------------------------------------------------------------------ process group

def _dist():
    d = getattr(_torch, "distributed", None)
    if d is not None and d.is_available() and d.is_initialized():
        return d
    return None


def open(root: Optional[str] = None, **kwargs) -> Checkpointer:  # noqa: A001
    """A Checkpointer for this process of a torch job.

    rank and world come from torch.distributed when it is initialized (else from the
    environment, as the C library reads it). A job of several ranks needs a secret:
    given here, or CKPT_JOB_SECRET / CKPT_JOB_SECRET_FILE; when there is none, rank 0
    draws 32 random bytes and broadcasts them over the default process group, so that
    only this job's ranks can reach its coordinator. Other keyword arguments are
    Checkpointer's."""
    d = _dist()
    if d is not None:
        kwargs.setdefault("rank", d.get_rank())
        kwargs.setdefault("world", d.get_world_size())
        if (kwargs["world"] > 1 and kwargs.get("secret") is None
                and not kwargs.get("no_auth")
                and not os.environ.get("CKPT_JOB_SECRET")
                and not os.environ.get("CKPT_JOB_SECRET_FILE")):
            box = [os.urandom(32).hex() if d.get_rank() == 0 else None]
            d.broadcast_object_list(box, src=0)
            kwargs["secret"] = bytes.fromhex(box[0])
    return Checkpointer(root, **kwargs)


# ------------------------------------------------------------------ RNG

class RNGState:
    """The random number generators of this process as one Stateful: Python's
    random, numpy's global generator (when numpy is imported), torch's CPU generator
    and every initialised CUDA device's. Saved rank-bound under the "rng" kind."""

    def state_dict(self) -> Dict[str, Any]:
        sd: Dict[str, Any] = {"python": random.getstate(), "torch": _torch.get_rng_state()}
        np = sys.modules.get("numpy")
        if np is not None:
            sd["numpy"] = np.random.get_state()
        if _torch.cuda.is_available() and _torch.cuda.is_initialized():
            sd["cuda"] = _torch.cuda.get_rng_state_all()
        return sd

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        random.setstate(_tuples(sd["python"]))
        _torch.set_rng_state(sd["torch"].cpu())
        if "numpy" in sd:
            import numpy as np
            np.random.set_state(_tuples(sd["numpy"]))
        if "cuda" in sd and _torch.cuda.is_available():
            states = [t.cpu() for t in sd["cuda"]]
            if len(states) != _torch.cuda.device_count():
                raise ShapeError(f"rng: the checkpoint holds {len(states)} CUDA generator "
                                 f"states, this process sees {_torch.cuda.device_count()} "
                                 "devices", -1008)
            _torch.cuda.set_rng_state_all(states)


def _tuples(v):
    if isinstance(v, (list, tuple)):
        return tuple(_tuples(x) for x in v)
    return v


# ------------------------------------------------------------------ names

def _component(key: Any, path: str) -> str:
    """A state_dict key as one name component: readable, and injective (a '/', '%',
    control byte, or a leading '.' is %-escaped; int keys are their digits, marked
    in the structure record)."""
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise TypeError(f"{path}: key {key!r} of type {type(key).__name__}: state keys "
                        "must be str or int")
    s = str(key)
    out = []
    for i, ch in enumerate(s):
        if ch in "/%" or ord(ch) < 0x20 or (i == 0 and ch == "."):
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    return "".join(out) or "%"


def _is_stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and \
        callable(getattr(obj, "load_state_dict", None))


def _kind_of(key: str, obj: Any) -> str:
    if isinstance(obj, RNGState):
        return "rng"
    if isinstance(obj, _torch.nn.Module):
        return "model"
    if isinstance(obj, _torch.optim.Optimizer):
        return "optimizer"
    sched = getattr(_torch.optim.lr_scheduler, "LRScheduler",
                    getattr(_torch.optim.lr_scheduler, "_LRScheduler", ()))
    if sched and isinstance(obj, sched):
        return "scheduler"
    return _KIND_BY_KEY.get(key, "extra")


# ------------------------------------------------------------------ DTensor boxes

def _dtensor_cls():
    for mod in ("torch.distributed.tensor", "torch.distributed._tensor"):
        m = sys.modules.get(mod)
        if m is None:
            try:
                __import__(mod)
                m = sys.modules[mod]
            except Exception:
                continue
        cls = getattr(m, "DTensor", None)
        if cls is not None:
            return cls
    return None


_DTENSOR = None


def _is_dtensor(t: Any) -> bool:
    global _DTENSOR
    if not isinstance(t, _torch.Tensor) or type(t) is _torch.Tensor:
        return False
    if _DTENSOR is None:
        _DTENSOR = _dtensor_cls() or type(None)
    return isinstance(t, _DTENSOR)


def _dtensor_box(t, path: str) -> Tuple[Tuple[int, ...], Tuple[int, ...], bool]:
    """(offset, extent, writer) of this rank's local shard of DTensor t: writer is
    False on the ranks that hold a replica another rank writes (a Replicate mesh
    dimension whose coordinate is not 0)."""
    mesh, placements = t.device_mesh, t.placements
    for p in placements:
        pname = type(p).__name__
        if pname not in ("Shard", "Replicate"):
            raise DTypeError(f"{path}: DTensor placement {p} cannot be stored as a box "
                             "(Partial values must be reduced, strided shards "
                             "redistributed, before a save)", -1009)
    coord = mesh.get_coordinate()
    if coord is None:          # this rank is not in the mesh: it holds nothing
        return (0,) * t.ndim, (0,) * t.ndim, False
    shape = list(t.shape)
    offset = [0] * t.ndim
    extent = list(shape)
    for mdim, p in enumerate(placements):
        if type(p).__name__ != "Shard":
            continue
        d = p.dim if p.dim >= 0 else p.dim + t.ndim
        n = mesh.size(mdim)
        # torch.chunk's rule, as DTensor's Shard uses: ceil-sized pieces, the last
        # ones smaller or empty.
        full = extent[d]
        piece = -(-full // n) if full else 0
        start = min(piece * coord[mdim], full)
        stop = min(start + piece, full)
        offset[d] += start
        extent[d] = stop - start
    local = t.to_local()
    if tuple(local.shape) != tuple(extent):
        raise ShapeError(f"{path}: DTensor local shard has shape {tuple(local.shape)}, "
                         f"its placements {placements} give {tuple(extent)} (padded "
                         "shards are not supported)", -1008)
    writer = all(c == 0 for mdim, c in enumerate(coord)
                 if type(placements[mdim]).__name__ == "Replicate")
    return tuple(offset), tuple(extent), writer


# ------------------------------------------------------------------ structure

class _Leaf:
    __slots__ = ("name", "value", "kind", "policy", "shape", "dtype", "is_numpy")

    def __init__(self, name, value, kind, policy, shape, dtype, is_numpy=False):
        self.name, self.value, self.kind, self.policy = name, value, kind, policy
        self.shape, self.dtype, self.is_numpy = shape, dtype, is_numpy


def _encode(obj: Any, base: str, path: str, leaves: List[_Leaf], kind: str,
            rank_bound: bool, allow_pickle: bool) -> Any:
    """The JSON structure record of obj; tensors become references to items."""
    if obj is None or isinstance(obj, bool) or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return {"i": str(obj)} if abs(obj) >= 2**53 else obj
    if isinstance(obj, float):
        return {"f": obj.hex()}
    if isinstance(obj, _torch.Tensor):
        if obj.is_complex():
            obj = _torch.view_as_real(obj)
            tag = "complex"
        else:
            tag = None
        code = dtype_code(obj.dtype, path)
        leaves.append(_Leaf(base, obj, kind, "rank-bound" if rank_bound else None,
                            tuple(obj.shape), code))
        rec = {"t": base, "dtype": dtype_name(code), "shape": list(obj.shape)}
        if tag:
            rec["view"] = tag
        if obj.requires_grad and not _is_dtensor(obj):
            rec["grad"] = True
        return rec
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        arr = obj
        if arr.dtype.kind == "u" and arr.itemsize > 1:
            # the format has no u16/u32/u64: store the bits as the signed integer of
            # the same width; the record keeps the array's own dtype
            arr = np.ascontiguousarray(arr).view(f"i{arr.itemsize}")
        code = dtype_code(arr.dtype, path)
        leaves.append(_Leaf(base, arr, kind, "rank-bound" if rank_bound else None,
                            tuple(arr.shape), code, True))
        return {"a": base, "dtype": dtype_name(code), "shape": list(obj.shape),
                "np": obj.dtype.str}
    if np is not None and isinstance(obj, np.generic):
        return {"np_scalar": obj.dtype.str, "v": _encode(obj.item(), base, path, leaves,
                                                         kind, rank_bound, allow_pickle)}
    if isinstance(obj, (bytes, bytearray)):
        return {"b": base64.b64encode(bytes(obj)).decode()}
    if isinstance(obj, _torch.dtype):
        return {"dtype": str(obj)}
    if isinstance(obj, _torch.Size):
        return {"size": list(obj)}
    if isinstance(obj, (list, tuple)):
        items = [_encode(v, f"{base}/{i}", f"{path}[{i}]", leaves, kind, rank_bound,
                         allow_pickle) for i, v in enumerate(obj)]
        return {"l": items} if isinstance(obj, list) else {"u": items}
    if isinstance(obj, Mapping):
        entries = []
        for k, v in obj.items():
            comp = _component(k, path)
            entries.append([k if isinstance(k, str) else {"i": str(k)},
                            _encode(v, f"{base}/{comp}", f"{path}[{k!r}]", leaves, kind,
                                    rank_bound, allow_pickle)])
        return {"d": entries}
    if allow_pickle:
        import pickle
        return {"pickle": base64.b64encode(pickle.dumps(obj)).decode()}
    raise TypeError(f"{path}: a {type(obj).__module__}.{type(obj).__name__} is not a "
                    "tensor, an array or plain data; pass allow_pickle=True to store it "
                    "pickled")


def _decode(rec: Any, dest: Any, fill: Callable[[dict, Any, str], Any], path: str,
            allow_pickle: bool) -> Any:
    """Rebuild a value from its structure record. dest is the destination's value at
    the same place (or None); fill loads a tensor record, in place into dest when it
    is a tensor."""
    if rec is None or isinstance(rec, (bool, str, int)):
        return rec
    if isinstance(rec, float):
        return rec
    if not isinstance(rec, dict) or not rec:
        raise _format_error(path, rec)
    if "i" in rec:
        return int(rec["i"])
    if "f" in rec:
        return float.fromhex(rec["f"])
    if "t" in rec or "a" in rec:
        return fill(rec, dest, path)
    if "np_scalar" in rec:
        import numpy as np
        return np.dtype(rec["np_scalar"]).type(_decode(rec["v"], None, fill, path,
                                                       allow_pickle))
    if "b" in rec:
        return base64.b64decode(rec["b"])
    if "dtype" in rec:
        name = rec["dtype"].replace("torch.", "")
        if not hasattr(_torch, name):
            raise DTypeError(f"{path}: torch.{name} is not in this torch", -1009)
        return getattr(_torch, name)
    if "size" in rec:
        return _torch.Size(rec["size"])
    if "l" in rec or "u" in rec:
        items = rec.get("l", rec.get("u"))
        dl = dest if isinstance(dest, (list, tuple)) else None
        out = [_decode(v, dl[i] if dl is not None and i < len(dl) else None, fill,
                       f"{path}[{i}]", allow_pickle) for i, v in enumerate(items)]
        return out if "l" in rec else tuple(out)
    if "d" in rec:
        out: Dict[Any, Any] = {}
        dm = dest if isinstance(dest, Mapping) else None
        for k, v in rec["d"]:
            key = int(k["i"]) if isinstance(k, dict) else k
            out[key] = _decode(v, dm.get(key) if dm is not None else None, fill,
                               f"{path}[{key!r}]", allow_pickle)
        return out
    if "pickle" in rec:
        if not allow_pickle:
            raise DTypeError(f"{path}: stored pickled; pass allow_pickle=True to load it "
                             "(only from a trusted checkpoint)", -1009)
        import pickle
        return pickle.loads(base64.b64decode(rec["pickle"]))
    raise _format_error(path, rec)


def _format_error(path, rec):
    from .errors import FormatError
    return FormatError(f"{path}: unknown structure record {str(rec)[:80]!r}", -1002)


# ------------------------------------------------------------------ save

def _part_state(key: str, obj: Any) -> Any:
    if _is_stateful(obj) and not isinstance(obj, Mapping):
        return obj.state_dict()
    return obj


def _assign_writers(sizes: List[Tuple[str, int]], world: int) -> Dict[str, int]:
    """Which rank writes each whole replicated tensor: largest first to the least
    loaded rank, ties to the lowest rank; the same on every rank, since every rank
    has the same names and sizes."""
    load = [0] * world
    out: Dict[str, int] = {}
    for name, n in sorted(sizes, key=lambda x: (-x[1], x[0])):
        r = min(range(world), key=lambda i: (load[i], i))
        out[name] = r
        load[r] += n
    return out


def save(ck: Checkpointer, step: int, state: Mapping[str, Any], *,
         meta: Optional[Mapping[str, Any]] = None,
         rank_bound: Optional[Sequence[str]] = None, replicas: str = "spread",
         allow_pickle: bool = False, wait: bool = False,
         incremental: Optional[bool] = None) -> Save:
    """Save state (a dict of parts) as step; returns the submitted Save.

    rank_bound: the top-level keys saved as each rank's own (default: the parts of
    kind "rng"). replicas: "spread" (each whole tensor written by one rank, the ranks
    sharing the bytes) or "all" (every rank writes it and the library checks that the
    copies agree). wait=True waits for the commit too. incremental: this save's
    choice (Save.set_incremental); None: the Checkpointer's."""
    if not isinstance(state, Mapping):
        raise TypeError("state must be a dict of parts, e.g. {'model': model, ...}")
    if replicas not in ("spread", "all"):
        raise ValueError("replicas: 'spread' or 'all'")
    world, rank = ck.world, ck.rank
    leaves: List[_Leaf] = []
    records: List[Tuple[str, str, str, bytes]] = []
    for key, obj in state.items():
        comp = _component(key, "state")
        kind = _kind_of(str(key), obj)
        rb = (key in rank_bound) if rank_bound is not None else kind == "rng"
        sd = _part_state(str(key), obj)
        start = len(leaves)
        rec = _encode(sd, comp, f"state[{key!r}]", leaves, kind, rb, allow_pickle)
        for leaf in leaves[start:]:
            leaf.kind = kind
        doc = {"format": _FORMAT, "key": key if isinstance(key, str) else {"i": str(key)},
               "kind": kind, "stateful": _is_stateful(obj) and not isinstance(obj, Mapping),
               "value": rec}
        records.append((STRUCTURE_PREFIX + comp, kind, "rank-bound" if rb else "replicated",
                        json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()))
    plain = [(l.name, l.value.numel() * l.value.element_size() if not l.is_numpy
              else l.value.nbytes) for l in leaves
             if l.policy is None and not (not l.is_numpy and _is_dtensor(l.value))]
    writers = _assign_writers(plain, world) if replicas == "spread" else {}
    def fill(s: Save) -> None:
        if incremental is not None:
            s.set_incremental(incremental)
        for name, kind, policy, text in records:
            s.add_blob(name, text, kind=kind, policy=policy)
        for l in leaves:
            if not l.is_numpy and _is_dtensor(l.value):
                offset, extent, writer = _dtensor_box(l.value, l.name)
                if l.policy == "rank-bound":
                    raise DTypeError(f"{l.name}: a DTensor cannot be rank-bound", -1009)
                # an empty piece adds nothing: the other ranks' boxes tile the shape
                if writer and all(extent):
                    s.add(l.name, l.value.to_local(), kind=l.kind, policy="sharded",
                          global_shape=tuple(l.value.shape), offset=offset)
                continue
            if l.policy == "rank-bound":
                s.add(l.name, l.value, kind=l.kind, policy="rank-bound")
            elif replicas == "all" or writers.get(l.name, 0) == rank:
                s.add(l.name, l.value, kind=l.kind, policy="replicated")

    return ck.begin(step).fill_and_submit(fill, meta=meta, wait=wait)


# ------------------------------------------------------------------ load

def load(ck: Checkpointer, state: Mapping[str, Any], step: Optional[int] = None, *,
         rank_bound: Union[str, Mapping[int, int], Callable[[int], int]] = "same",
         strict: bool = True, allow_pickle: bool = False) -> int:
    """Load step (None: the latest committed) into state, in place; returns the step.

    Every tensor of state is filled in place (DTensors: the box their placements
    give, whatever the saved sharding); Stateful parts get load_state_dict with the
    rebuilt state_dict (tensors missing from theirs, like a fresh optimizer's
    moments, are created on the CPU); plain dict parts are updated. rank_bound: how
    this rank's rank-bound parts are found: "same" (this rank's own: same world
    size), "skip" (left as they are), or a map / function new rank -> saved rank.
    strict: a part of state missing from the checkpoint raises NotFoundError."""
    with ck.load(step) as ld:
        for key, obj in state.items():
            _load_part(ld, ck, key, obj, state, rank_bound, strict, allow_pickle)
        return ld.step


def _load_part(ld: Load, ck: Checkpointer, key: Any, obj: Any, state: Mapping[str, Any],
               rank_bound, strict: bool, allow_pickle: bool) -> None:
    comp = _component(key, "state")
    rname = STRUCTURE_PREFIX + comp
    if rname not in ld:
        if strict:
            raise NotFoundError(f"step {ld.step}: no part {key!r} (present: "
                                f"{', '.join(_parts(ld)) or 'none'})", -1004)
        return
    info = ld.info(rname)
    saved_rank = None
    if info.policy == "rank-bound":
        if rank_bound == "skip":
            return
        if rank_bound != "same":
            saved_rank = (rank_bound(ck.rank) if callable(rank_bound)
                          else rank_bound[ck.rank])
    try:
        doc = json.loads(ld.blob(rname, saved_rank=saved_rank))
    except RankBoundError as e:
        raise RankBoundError(f"part {key!r}: {e.message} (load with rank_bound='skip' "
                             "or a map of ranks)", e.code) from None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise _format_error(f"part {key!r}", doc)
    if isinstance(obj, _torch.optim.Optimizer) and not obj.state:
        _init_optimizer_state(obj)
    template = _part_state(str(key), obj)
    reads: List[Tuple[str, Any, Any, Any]] = []

    def fill(rec: dict, dest: Any, path: str) -> Any:
        name = rec.get("t", rec.get("a"))
        if not isinstance(name, str) or name not in ld:
            raise NotFoundError(f"step {ld.step}: {path} refers to {name!r}, which the "
                                "step does not hold", -1004)
        item = ld.info(name)
        code = dtype_code(item.dtype)
        if "a" in rec:
            import numpy as np
            out = np.empty(item.shape, dtype=numpy_dtype_for(code))
            reads.append((name, out, None, None))
            want = np.dtype(rec.get("np", out.dtype.str))
            if want != out.dtype and want.itemsize == out.itemsize:
                return out.view(want)
            return out
        view = rec.get("view")
        if isinstance(dest, _torch.Tensor) and view == "complex" and dest.is_complex():
            dest_real = _torch.view_as_real(dest)
        else:
            dest_real = dest
        if _is_dtensor(dest_real):
            if tuple(dest_real.shape) != item.shape:
                raise ShapeError(f"{path}: the checkpoint's {name!r} has shape "
                                 f"{item.shape}, the destination {tuple(dest_real.shape)}",
                                 -1008)
            offset, extent, _ = _dtensor_box(dest_real, path)
            local = dest_real.to_local()
            if all(extent):
                reads.append((name, local, offset, extent))
            return dest
        if isinstance(dest_real, _torch.Tensor):
            if tuple(dest_real.shape) != item.shape:
                raise ShapeError(f"{path}: the checkpoint's {name!r} has shape "
                                 f"{item.shape}, the destination {tuple(dest_real.shape)}",
                                 -1008)
            if dtype_code(dest_real.dtype, path) != code:
                raise DTypeError(f"{path}: the checkpoint's {name!r} is {item.dtype}, the "
                                 f"destination {dtype_name(dtype_code(dest_real.dtype))} "
                                 "(convert after loading, never silently)", -1009)
            reads.append((name, dest_real, None, None))
            return dest
        t = _torch.empty(item.shape, dtype=torch_dtype_for(code))
        reads.append((name, t, None, None))
        if view == "complex":
            t = _torch.view_as_complex(t)
        if rec.get("grad"):
            t.requires_grad_(True)
        return t

    value = _decode(doc.get("value"), template, fill, f"state[{key!r}]", allow_pickle)
    with _torch.no_grad():
        if reads:
            sr = saved_rank if info.policy == "rank-bound" else None
            ld.read_many(reads, saved_rank=sr)
    if _is_stateful(obj) and not isinstance(obj, Mapping):
        obj.load_state_dict(value)
    elif isinstance(obj, dict) and isinstance(value, dict):
        obj.clear()
        obj.update(value)
    elif isinstance(state, dict):
        state[key] = value
    else:
        raise TypeError(f"part {key!r}: cannot be loaded in place (not Stateful, not a "
                        "dict, and the state is not a dict)")


def _init_optimizer_state(optim) -> None:
    """Give a fresh optimizer its state tensors (a step with zero learning rate and
    zero gradients, as torch.distributed.checkpoint's set_state_dict does), so that
    the load fills them in place, as DTensors where the parameters are DTensors and on
    the parameters' devices. Without that helper (torch < 2.2) the load creates the
    state on the CPU and load_state_dict moves it."""
    try:
        from torch.distributed.checkpoint.state_dict import _init_optim_state
    except Exception:
        return
    _init_optim_state(optim)


def _parts(ld: Load) -> List[str]:
    return [n[len(STRUCTURE_PREFIX):] for n in ld if n.startswith(STRUCTURE_PREFIX)]
