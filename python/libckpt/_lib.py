"""The C library, loaded with ctypes, and the declarations of ckpt/ckpt.h it uses.

Nothing here does checkpoint work: every call goes to libckpt.so. This module only
finds the library, declares the prototypes and mirrors the public structs field
for field (their layout is the C ABI of include/ckpt/ckpt.h; fields are only ever
appended there, and the size-first structs tell the library which fields we know).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_char_p, c_double, c_int, c_size_t, c_uint,
                    c_uint8, c_uint32, c_uint64, c_void_p)
from typing import List, Optional

__all__ = ["lib", "LibraryNotFoundError", "library_path", "MAX_NDIM", "LATEST"]

MAX_NDIM = 16
LATEST = (1 << 64) - 1
SONAME = "libckpt.so.0"


class LibraryNotFoundError(ImportError):
    """libckpt.so could not be loaded; the message lists every place looked at."""


def _candidates() -> List[str]:
    """Where libckpt.so may be, in the order tried (see docs/python.md)."""
    out: List[str] = []
    here = os.path.dirname(os.path.abspath(__file__))
    # 1. beside an installed package: PREFIX/lib/pythonX/.../libckpt -> PREFIX/lib,
    #    PREFIX/lib/<multiarch>; and the repository's build tree, python/../build.
    d = here
    for _ in range(6):
        d = os.path.dirname(d)
        for sub in ("build", "lib", "lib64"):
            base = os.path.join(d, sub)
            out.append(os.path.join(base, SONAME))
            if sub == "lib" and os.path.isdir(base):
                for name in sorted(os.listdir(base)):
                    if name.endswith("-linux-gnu"):
                        out.append(os.path.join(base, name, SONAME))
    return out


class _DlInfo(Structure):
    """Dl_info of <dlfcn.h>."""
    _fields_ = [("dli_fname", c_char_p), ("dli_fbase", c_void_p),
                ("dli_sname", c_char_p), ("dli_saddr", c_void_p)]


def _path_of(cdll, name: str) -> str:
    """The absolute path of the file the loader mapped for cdll, which was loaded as
    name: a bare SONAME found through LD_LIBRARY_PATH or ldconfig, or a relative
    path, says nothing about where the library lies (python -m libckpt looks for
    the tools beside it)."""
    for libc_name in (None, "libdl.so.2"):
        try:
            dladdr = ctypes.CDLL(libc_name).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.argtypes = [c_void_p, POINTER(_DlInfo)]
        dladdr.restype = c_int
        info = _DlInfo()
        if dladdr(ctypes.cast(cdll.ckpt_version, c_void_p), ctypes.byref(info)) \
                and info.dli_fname:
            return os.path.abspath(os.fsdecode(info.dli_fname))
    return os.path.abspath(name) if os.sep in name else name


def _load():
    cdll, name = _open()
    return cdll, _path_of(cdll, name)


def _open():
    tried: List[str] = []
    env = os.environ.get("LIBCKPT_LIBRARY")
    if env:
        try:
            return ctypes.CDLL(env), env
        except OSError as e:
            raise LibraryNotFoundError(
                f"LIBCKPT_LIBRARY={env}: cannot load it: {e}") from None
    for path in _candidates():
        if os.path.exists(path):
            try:
                return ctypes.CDLL(path), path
            except OSError as e:
                tried.append(f"{path} ({e})")
        else:
            tried.append(path)
    # 2. the system's loader: LD_LIBRARY_PATH, ldconfig's cache (an installed prefix).
    for name in (SONAME, ctypes.util.find_library("ckpt")):
        if not name:
            continue
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            tried.append(f"{name} through the dynamic loader ({e})")
    raise LibraryNotFoundError(
        "libckpt: cannot find libckpt.so. Set LIBCKPT_LIBRARY to its path, or install "
        "the library where the dynamic loader finds it. Looked for:\n  "
        + "\n  ".join(tried))


# ------------------------------------------------------------------ structs

class Opts(Structure):
    """struct ckpt_opts."""
    _fields_ = [
        ("size", c_size_t),
        ("root", c_char_p),
        ("flags", c_uint),
        ("rank", c_int), ("world", c_int),
        ("coord_addr", c_char_p),
        ("coord_port", c_uint),
        ("transport", c_int),
        ("job_id", c_char_p),
        ("secret", c_void_p),
        ("secret_len", c_size_t),
        ("pool_bytes", c_size_t),
        ("chunk_bytes", c_size_t),
        ("zstd_level", c_int),
        ("max_inflight", c_uint),
        ("timeout_ms", c_uint),
        ("queue_depth", c_uint),
        ("gds", c_uint),
        ("log_fn", c_void_p),
        ("log_arg", c_void_p),
        ("log_level", c_int),
        ("keep_last", c_uint64),
        ("keep_every", c_uint64),
        ("keep_seconds", c_uint64),
        ("manifest_dir", c_char_p),
        ("target", c_char_p),
        ("compress_codec", c_int),
        ("compress_threads", c_uint),
        ("incremental", c_int),
        ("device_pool_bytes", c_size_t),
    ]


class LogCtx(Structure):
    """struct ckpt_log_ctx."""
    _fields_ = [("job_id", c_char_p), ("rank", c_int), ("step", c_uint64)]


# ckpt_log_fn: void (*)(void *arg, int level, const struct ckpt_log_ctx *where,
#                       const char *msg)
LOG_FN = ctypes.CFUNCTYPE(None, c_void_p, c_int, POINTER(LogCtx), c_char_p)


class Tensor(Structure):
    """struct ckpt_tensor."""
    _fields_ = [
        ("name", c_char_p),
        ("kind", c_int), ("dtype", c_int), ("policy", c_int),
        ("ndim", c_uint),
        ("global_shape", POINTER(c_uint64)),
        ("offset", POINTER(c_uint64)),
        ("extent", POINTER(c_uint64)),
        ("data", c_void_p),
        ("mem", c_int),
    ]


class SaveStats(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("logical_bytes", c_uint64), ("stored_bytes", c_uint64),
        ("snapshot_seconds", c_double), ("durable_seconds", c_double),
        ("commit_seconds", c_double),
        ("referenced_bytes", c_uint64), ("device_staged_bytes", c_uint64),
        ("device_unchanged_bytes", c_uint64),
    ]


class StepInfo(Structure):
    _fields_ = [
        ("step", c_uint64),
        ("state", c_int), ("trust", c_int),
        ("world", c_uint32), ("ntensors", c_uint32),
        ("logical_bytes", c_uint64), ("stored_bytes", c_uint64),
        ("commit_time_ns", c_uint64),
        ("has_record", c_int), ("has_dir", c_int),
        ("nfiles", c_uint32),
        ("dir_bytes", c_uint64),
    ]


class TensorInfo(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("kind", c_int), ("dtype", c_int), ("policy", c_int),
        ("ndim", c_uint),
        ("global_shape", c_uint64 * MAX_NDIM),
        ("nshards", c_uint32), ("nchunks", c_uint32),
        ("logical_bytes", c_uint64), ("stored_bytes", c_uint64),
    ]


class LoadReq(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("dtype", c_int),
        ("ndim", c_uint),
        ("offset", POINTER(c_uint64)),
        ("extent", POINTER(c_uint64)),
        ("dst", c_void_p),
        ("mem", c_int),
        ("saved_rank", c_int),
        ("flags", c_uint),
    ]


class ChunkInfo(Structure):
    _fields_ = [
        ("rank", c_uint32), ("chunk", c_uint32),
        ("file", c_char_p),
        ("file_offset", c_uint64), ("stored_len", c_uint64),
        ("raw_offset", c_uint64), ("raw_len", c_uint64),
        ("codec", c_int),
        ("hash", c_uint8 * 16),
        ("box_offset", c_uint64 * MAX_NDIM),
        ("box_extent", c_uint64 * MAX_NDIM),
        ("hash_blocks", c_uint32),
    ]


_P = c_void_p
_PROTOS = {
    "ckpt_version": (c_char_p, []),
    "ckpt_strerror": (c_char_p, [c_int]),
    "ckpt_last_error": (c_char_p, []),
    "ckpt_dtype_size": (c_size_t, [c_int]),
    "ckpt_dtype_name": (c_char_p, [c_int]),
    "ckpt_kind_name": (c_char_p, [c_int]),
    "ckpt_policy_name": (c_char_p, [c_int]),
    "ckpt_name_check": (c_int, [c_char_p, c_size_t]),
    "ckpt_opts_init": (None, [POINTER(Opts), c_size_t]),
    "ckpt_open": (c_int, [POINTER(Opts), POINTER(_P)]),
    "ckpt_close": (None, [_P]),
    "ckpt_rank": (c_int, [_P]),
    "ckpt_world": (c_int, [_P]),
    "ckpt_cuda_available": (c_int, [_P]),
    "ckpt_save_begin": (c_int, [_P, c_uint64, POINTER(_P)]),
    "ckpt_save_add_tensor": (c_int, [_P, POINTER(Tensor)]),
    "ckpt_save_add_blob": (c_int, [_P, c_char_p, c_int, c_int, c_void_p, c_size_t]),
    "ckpt_save_set_stream": (c_int, [_P, c_void_p]),
    "ckpt_save_submit": (c_int, [_P]),
    "ckpt_save_wait_snapshot": (c_int, [_P, c_int]),
    "ckpt_save_wait": (c_int, [_P, c_int]),
    "ckpt_save_free": (None, [_P]),
    "ckpt_save_stats": (c_int, [_P, POINTER(SaveStats)]),
    "ckpt_load_open": (c_int, [_P, c_uint64, POINTER(_P)]),
    "ckpt_load_close": (None, [_P]),
    "ckpt_load_step": (c_uint64, [_P]),
    "ckpt_load_tensors": (c_int, [_P, POINTER(LoadReq), c_size_t, POINTER(c_int)]),
    "ckpt_load_blob": (c_int, [_P, c_char_p, c_void_p, c_size_t, POINTER(c_size_t)]),
    "ckpt_load_blob_rank": (c_int, [_P, c_char_p, c_int, c_void_p, c_size_t,
                                    POINTER(c_size_t)]),
    "ckpt_load_count": (c_int, [_P]),
    "ckpt_load_info": (c_int, [_P, c_uint, POINTER(TensorInfo), c_size_t]),
    "ckpt_load_is_blob": (c_int, [_P, c_uint]),
    "ckpt_load_chunks": (c_int, [_P, c_uint, POINTER(ChunkInfo), c_size_t, c_size_t]),
    "ckpt_steps": (c_int, [_P, c_uint, POINTER(StepInfo), c_size_t, c_size_t]),
    "ckpt_step_info": (c_int, [_P, c_uint64, POINTER(StepInfo), c_size_t]),
}
# Declared when the library has them (added in later minor versions).
_OPTIONAL = {
    "ckpt_save_set_meta": (c_int, [_P, c_char_p, c_size_t]),
    "ckpt_save_set_incremental": (c_int, [_P, c_int]),
    "ckpt_step_meta": (c_int, [_P, c_uint64, c_char_p, c_size_t, POINTER(c_size_t)]),
}


def _declare(cdll) -> None:
    for name, (res, args) in _PROTOS.items():
        fn = getattr(cdll, name)
        fn.restype = res
        fn.argtypes = args
    for name, (res, args) in _OPTIONAL.items():
        fn = getattr(cdll, name, None)
        if fn is not None:
            fn.restype = res
            fn.argtypes = args


lib, library_path = _load()
_declare(lib)


def has(name: str) -> bool:
    """True when the loaded library exports the function name."""
    return getattr(lib, name, None) is not None


def last_error() -> str:
    return (lib.ckpt_last_error() or b"").decode("utf-8", "replace")


def strerror(code: int) -> str:
    return (lib.ckpt_strerror(code) or b"").decode("utf-8", "replace")


def version() -> str:
    return lib.ckpt_version().decode()


def u64_array(values) -> Optional[ctypes.Array]:
    if values is None:
        return None
    vals = [int(v) for v in values]
    return (c_uint64 * max(len(vals), 1))(*vals)
