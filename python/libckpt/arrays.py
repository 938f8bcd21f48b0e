"""Arrays and tensors as libckpt sees them: a dtype, a shape, and contiguous bytes
in host or device memory.

numpy arrays and torch tensors (CPU and CUDA) are taken as they are when they are
C-contiguous. A non-contiguous one is never read as if it were: a save copies it
into a contiguous array that the save keeps until its snapshot point, and a load
reads into a contiguous buffer and copies that into place. torch and numpy are
imported only when the caller hands us one of their objects.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from .errors import DTypeError

__all__ = ["DTYPES", "dtype_code", "dtype_name", "View", "view_of", "numpy_dtype_for",
           "torch_dtype_for"]

# enum ckpt_dtype, by the names ckpt_dtype_name gives.
DTYPES = {"f64": 1, "f32": 2, "f16": 3, "bf16": 4, "f8_e4m3": 5, "f8_e5m2": 6,
          "i64": 7, "i32": 8, "i16": 9, "i8": 10, "u8": 11, "bool": 12}
_NAMES = {v: k for k, v in DTYPES.items()}
_SIZES = {1: 8, 2: 4, 3: 2, 4: 2, 5: 1, 6: 1, 7: 8, 8: 4, 9: 2, 10: 1, 11: 1, 12: 1}

_NUMPY = {"float64": "f64", "float32": "f32", "float16": "f16", "int64": "i64",
          "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "bool",
          # ml_dtypes' extension types, when the caller uses them
          "bfloat16": "bf16", "float8_e4m3fn": "f8_e4m3", "float8_e5m2": "f8_e5m2"}
# numpy has no bf16 or fp8: they come back as raw bits of the same width.
_NUMPY_RAW = {"bf16": "uint16", "f8_e4m3": "uint8", "f8_e5m2": "uint8"}

_TORCH = {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
          "float8_e4m3fn": "f8_e4m3", "float8_e5m2": "f8_e5m2", "int64": "i64",
          "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "bool"}


def dtype_code(dtype: Any, what: str = "dtype") -> int:
    """enum ckpt_dtype of a libckpt name ("bf16"), a numpy dtype or a torch dtype."""
    if isinstance(dtype, int) and dtype in _NAMES:
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    name = _foreign_name(dtype)
    if name is not None:
        return DTYPES[name]
    raise DTypeError(f"{what}: dtype {dtype!r} has no libckpt equivalent "
                     f"(libckpt stores {', '.join(DTYPES)})")


def dtype_name(code: int) -> str:
    return _NAMES.get(code, "?")


def dtype_size(code: int) -> int:
    return _SIZES[code]


def _foreign_name(dtype: Any) -> Optional[str]:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        return _TORCH.get(str(dtype).replace("torch.", ""))
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            dt = np.dtype(dtype)
        except TypeError:
            return None
        return _NUMPY.get(dt.name)
    return None


def numpy_dtype_for(code: int):
    """The numpy dtype that holds a libckpt dtype: itself, or raw bits of its width
    (bf16 as uint16, fp8 as uint8) — or ml_dtypes' type when ml_dtypes is imported."""
    import numpy as np
    name = _NAMES[code]
    ml = sys.modules.get("ml_dtypes")
    if name in _NUMPY_RAW:
        if ml is not None:
            return np.dtype({"bf16": ml.bfloat16, "f8_e4m3": ml.float8_e4m3fn,
                             "f8_e5m2": ml.float8_e5m2}[name])
        return np.dtype(_NUMPY_RAW[name])
    return np.dtype({v: k for k, v in _NUMPY.items() if k not in
                     ("bfloat16", "float8_e4m3fn", "float8_e5m2")}[name])


def torch_dtype_for(code: int):
    import torch
    name = _NAMES[code]
    for tname, n in _TORCH.items():
        if n == name and hasattr(torch, tname):
            return getattr(torch, tname)
    raise DTypeError(f"dtype {name}: this torch ({torch.__version__}) has no such dtype")


@dataclass
class View:
    """What the library needs of one array: pointer, bytes, dtype, shape, memory.
    keep holds the object that owns the bytes (the caller's, or our contiguous copy)."""
    ptr: int
    nbytes: int
    dtype: int
    shape: Tuple[int, ...]
    device: bool
    keep: Any
    copied: bool = False
    cuda_device: int = -1


def _is_torch(obj) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _is_numpy(obj) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.ndarray)


def view_of(obj: Any, name: str, dtype: Any = None, writable: bool = False) -> View:
    """A View of a numpy array or torch tensor for tensor name.

    dtype overrides the element type where numpy has none: a uint16 array holding
    bf16 bits with dtype="bf16", uint8 holding fp8. The override must have the
    array's element width. For a save (writable False) a non-contiguous array is
    copied into a contiguous one, kept by the View; for a load (writable True) the
    caller handles it (see Load.read)."""
    if _is_torch(obj):
        t = obj
        if t.is_sparse or getattr(t, "is_quantized", False):
            raise DTypeError(f"tensor {name!r}: sparse and quantized tensors are not "
                             "supported; convert to a dense tensor first")
        if type(t).__name__ == "DTensor":
            raise DTypeError(f"tensor {name!r} is a DTensor: save its local shard with "
                             "its box (libckpt.torch does this)")
        if t.is_complex():
            raise DTypeError(f"tensor {name!r}: complex dtype {t.dtype} has no libckpt "
                             "equivalent; save torch.view_as_real(t)")
        code = _override(dtype, t.dtype, t.element_size(), name, f"tensor {name!r}")
        copied = False
        if not t.is_contiguous():
            if writable:
                raise ValueError(f"tensor {name!r} is not contiguous")
            t = t.contiguous()
            copied = True
        if t.device.type not in ("cpu", "cuda"):
            raise DTypeError(f"tensor {name!r} is on {t.device}: libckpt reads host "
                             "and CUDA memory only")
        dev = t.device.type == "cuda"
        return View(t.data_ptr(), t.numel() * t.element_size(), code, tuple(t.shape), dev,
                    t, copied, t.device.index if dev else -1)
    if _is_numpy(obj):
        import numpy as np
        a = obj
        code = _override(dtype, a.dtype, a.itemsize, name, f"array {name!r}")
        copied = False
        if not a.flags.c_contiguous:
            if writable:
                raise ValueError(f"array {name!r} is not contiguous")
            a = np.ascontiguousarray(a)
            copied = True
        if writable and not a.flags.writeable:
            raise ValueError(f"array {name!r} is read-only")
        ptr = a.__array_interface__["data"][0]
        return View(ptr, a.nbytes, code, tuple(a.shape), False, a, copied)
    raise TypeError(f"{name!r}: expected a numpy array or a torch tensor, got "
                    f"{type(obj).__name__}")


def _override(dtype: Any, native: Any, itemsize: int, name: str, what: str) -> int:
    """The element type: the array's own, or the override. The override decides
    alone: a uint16 array of bf16 bits has no libckpt type of its own (there is no
    u16), so its native type is not looked up when one is given."""
    if dtype is None:
        return dtype_code(native, what)
    want = dtype_code(dtype, f"{name!r}")
    if _SIZES[want] != itemsize:
        raise DTypeError(f"{name!r}: dtype {dtype_name(want)} is {_SIZES[want]} bytes "
                         f"per element, the array's elements are {itemsize}")
    return want
