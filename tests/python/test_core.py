"""The Python binding's core (python/libckpt) against the built libckpt.so.

Round trips of every dtype of the format through numpy and torch, bit-exact (the
test data are random bits: NaNs, infinities and negative zeros included); scalars,
empty and multi-chunk arrays; non-contiguous arrays saved as their logical contents
and loaded into non-contiguous outs; boxes; blobs; the step listing; every error the
binding maps, with the library's message naming the object; the save handle's
waits and the lifetime of the arrays it holds; python -m libckpt.

Run by tests/python/run_pytest.sh (ctest python_core). Data come from
CKPT_TEST_SEED, printed with each failing test's output.
"""
import ctypes
import errno
import os
import subprocess
import sys
import textwrap
import time
import zlib

import numpy as np
import pytest

import libckpt

SEED = int(os.environ.get("CKPT_TEST_SEED") or int(time.time()))

# The format's dtypes: the numpy array that holds each (raw bits where numpy has no
# such type) and the dtype= override that says what the bits are.
NUMPY_DTYPES = {
    "f64": (np.float64, None), "f32": (np.float32, None), "f16": (np.float16, None),
    "bf16": (np.uint16, "bf16"), "f8_e4m3": (np.uint8, "f8_e4m3"),
    "f8_e5m2": (np.uint8, "f8_e5m2"), "i64": (np.int64, None), "i32": (np.int32, None),
    "i16": (np.int16, None), "i8": (np.int8, None), "u8": (np.uint8, None),
    "bool": (np.bool_, None),
}
assert set(NUMPY_DTYPES) == set(libckpt.DTYPES), "a dtype of the format is not tested"

TORCH_DTYPES = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
                "f8_e4m3": "float8_e4m3fn", "f8_e5m2": "float8_e5m2", "i64": "int64",
                "i32": "int32", "i16": "int16", "i8": "int8", "u8": "uint8",
                "bool": "bool"}


@pytest.fixture
def rng(request):
    """A generator of its own per test (the seed and the test's name), so that one
    test fails the same way alone or in the file."""
    print(f"CKPT_TEST_SEED={SEED}")
    return np.random.default_rng([SEED, zlib.crc32(request.node.name.encode())])


@pytest.fixture
def ck(tmp_path):
    with libckpt.Checkpointer(tmp_path / "root") as c:
        yield c


def random_array(rng, dtype, shape):
    """Random bits of dtype (every bit pattern of a float, 0/1 for bool)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if dt == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    raw = rng.integers(0, 256, size=n * dt.itemsize, dtype=np.uint8)
    return raw.view(dt).reshape(shape)


def same_bits(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def tensor_bytes(t):
    t = t.contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def torch_or_skip():
    return pytest.importorskip("torch", reason="torch is not installed "
                               "(scripts/deps.sh installs python3-torch)")


def random_tensor(rng, torch, tdtype, shape):
    if tdtype == torch.bool:
        return torch.from_numpy(random_array(rng, np.bool_, shape))
    size = torch.empty((), dtype=tdtype).element_size()
    raw = random_array(rng, np.uint8, (int(np.prod(shape, dtype=np.int64)) * size,))
    return torch.frombuffer(bytearray(raw.tobytes()), dtype=tdtype).reshape(shape)


# ------------------------------------------------------------------ round trips

@pytest.mark.parametrize("name", list(NUMPY_DTYPES))
def test_numpy_round_trip(ck, rng, name):
    npdt, override = NUMPY_DTYPES[name]
    a = random_array(rng, npdt, (3, 5, 7))
    s = ck.begin(1)
    s.add("t/" + name, a, dtype=override)
    s.submit()
    st = s.wait()
    assert st.logical_bytes == a.nbytes
    with ck.load(1) as ld:
        info = ld.info("t/" + name)
        assert (info.dtype, info.shape, info.is_blob) == (name, (3, 5, 7), False)
        got = ld.read("t/" + name)
        assert got.dtype == np.dtype(npdt)
        assert same_bits(got, a)
        out = np.zeros_like(a)
        assert ld.read("t/" + name, out=out) is out
        assert same_bits(out, a)


@pytest.mark.parametrize("name", ["f64", "f32", "bf16", "i64", "u8", "bool"])
def test_scalar(ck, rng, name):
    npdt, override = NUMPY_DTYPES[name]
    a = random_array(rng, npdt, ())
    assert a.ndim == 0
    s = ck.begin(1)
    s.add("scalar", a, dtype=override)
    s.submit().wait()
    with ck.load() as ld:
        assert ld.info("scalar").shape == ()
        got = ld.read("scalar")
        assert got.shape == () and same_bits(got, a)
        out = np.zeros((), dtype=npdt)
        ld.read("scalar", out=out)
        assert same_bits(out, a)


@pytest.mark.parametrize("shape", [(0,), (4, 0, 3), (0, 0)])
def test_empty(ck, shape):
    a = np.empty(shape, dtype=np.float32)
    ck.save(1, {"empty": a, "other": np.arange(3, dtype=np.int16)}, wait=True)
    with ck.load(1) as ld:
        assert ld.info("empty").shape == shape
        assert ld.info("empty").logical_bytes == 0
        got = ld.read("empty")
        assert got.shape == shape and got.dtype == np.float32
        assert list(ld.read("other")) == [0, 1, 2]


def test_multi_chunk(tmp_path, rng):
    a = random_array(rng, np.float32, (301, 257))          # 302 KiB: 76 chunks
    b = random_array(rng, np.int8, (4096 * 3 + 17,))       # a partial last chunk
    with libckpt.Checkpointer(tmp_path / "root", chunk_bytes=4096) as ck:
        ck.save(7, {"a": a, "b": b}, wait=True)
        with ck.load(7) as ld:
            assert ld.info("a").nchunks == -(-a.nbytes // 4096)
            assert ld.info("b").nchunks == 4
            assert same_bits(ld.read("a"), a)
            assert same_bits(ld.read("b"), b)
            # a box across many chunks, not aligned to any of them
            box = ld.read("a", offset=(17, 3), extent=(250, 200))
            assert same_bits(box, a[17:267, 3:203])


@pytest.mark.parametrize("name", list(TORCH_DTYPES))
def test_torch_round_trip(ck, rng, name):
    torch = torch_or_skip()
    tname = TORCH_DTYPES[name]
    if not hasattr(torch, tname):
        pytest.skip(f"torch {torch.__version__} has no torch.{tname}")
    tdt = getattr(torch, tname)
    t = random_tensor(rng, torch, tdt, (4, 6, 3))
    ck.save(1, {"t": t}, wait=True)
    with ck.load(1) as ld:
        assert ld.info("t").dtype == name
        out = torch.zeros((4, 6, 3), dtype=tdt)
        assert ld.read("t", out=out) is out
        assert tensor_bytes(out) == tensor_bytes(t)
        # without an out: numpy, raw bits where numpy has no such type
        got = ld.read("t")
        assert got.shape == (4, 6, 3)
        assert got.tobytes() == tensor_bytes(t)


def test_torch_scalar_and_empty(ck, rng):
    torch = torch_or_skip()
    s = torch.tensor(2.5, dtype=torch.float64)
    e = torch.empty((0, 3), dtype=torch.bfloat16)
    ck.save(1, {"s": s, "e": e}, wait=True)
    with ck.load(1) as ld:
        out = torch.zeros((), dtype=torch.float64)
        ld.read("s", out=out)
        assert out.item() == 2.5
        oe = torch.empty((0, 3), dtype=torch.bfloat16)
        assert ld.read("e", out=oe).shape == (0, 3)


# ------------------------------------------------------------------ layouts and boxes

def test_numpy_non_contiguous(ck, rng):
    base = random_array(rng, np.float64, (12, 10))
    views = {
        "transposed": base.T,
        "stepped": base[1::3, ::2],
        "negative": base[::-1, 2:9:3],
        "bf16_stepped": random_array(rng, np.uint16, (8, 9))[:, ::4],
    }
    for v in views.values():
        assert not v.flags.c_contiguous
    s = ck.begin(1)
    for name, v in views.items():
        s.add(name, v, dtype="bf16" if name.startswith("bf16") else None)
    s.submit().wait()
    with ck.load(1) as ld:
        for name, v in views.items():
            assert ld.info(name).shape == v.shape
            assert ld.info(name).logical_bytes == v.nbytes
            assert same_bits(ld.read(name), v), name
        # into a non-contiguous out: its elements get the box, the rest stays
        big = np.full((24, 30), -1.0)
        out = big[::2, ::3]                                    # (12, 10), strided
        assert not out.flags.c_contiguous
        assert ld.read("transposed", out=out.T) is not None    # out.T: (10, 12)
        assert same_bits(out.T, views["transposed"])
        mask = np.ones(big.shape, dtype=bool)
        mask[::2, ::3] = False
        assert (big[mask] == -1.0).all()


def test_torch_non_contiguous(ck, rng):
    torch = torch_or_skip()
    base = random_tensor(rng, torch, torch.float32, (10, 8))
    views = {"t": base.t(), "s": base[::3, 1::2], "bf": base.to(torch.bfloat16)[2:, ::3]}
    for v in views.values():
        assert not v.is_contiguous()
    ck.save(1, views, wait=True)
    with ck.load(1) as ld:
        for name, v in views.items():
            assert ld.read(name).tobytes() == tensor_bytes(v), name
        big = torch.full((20, 16), 7.0)
        out = big[::2, ::2].t()                       # (8, 10), not contiguous
        ld.read("t", out=out)
        assert tensor_bytes(out) == tensor_bytes(views["t"])
        rest = big.clone()
        rest[::2, ::2] = 7.0
        assert bool((rest == 7.0).all())


def test_read_box(ck, rng):
    a = random_array(rng, np.int32, (6, 7, 5))
    ck.save(3, {"a": a}, wait=True)
    with ck.load(3) as ld:
        for off, ext in [((0, 0, 0), (6, 7, 5)), ((1, 2, 3), (4, 5, 2)),
                         ((5, 6, 4), (1, 1, 1)), ((2, 0, 0), (0, 7, 5))]:
            sl = tuple(slice(o, o + e) for o, e in zip(off, ext))
            assert same_bits(ld.read("a", offset=off, extent=ext), a[sl]), (off, ext)
        # offset alone: to the end of each dimension
        assert same_bits(ld.read("a", offset=(4, 1, 0)), a[4:, 1:, :])
        out = np.zeros((2, 3, 5), dtype=np.int32)
        ld.read("a", out=out, offset=(1, 1, 0), extent=(2, 3, 5))
        assert same_bits(out, a[1:3, 1:4])
        one, two = ld.read_many([("a", None, (0, 0, 0), (1, 7, 5)),
                                 ("a", None, (5, 0, 0), None)])
        assert same_bits(one, a[:1]) and same_bits(two, a[5:])


def test_sharded_boxes_must_cover(ck, rng):
    """A sharded tensor's boxes are checked at commit: a box that leaves a gap
    aborts the step with ValidationError naming the tensor."""
    a = random_array(rng, np.float32, (2, 5))
    s = ck.begin(1)
    s.add("w", a, policy="sharded", global_shape=(4, 5), offset=(0, 0))
    s.submit()
    with pytest.raises(libckpt.ValidationError, match="'w'"):
        s.wait()
    assert ck.latest is None
    s = ck.begin(2)
    s.add("w", a, policy="sharded", global_shape=(2, 5), offset=(0, 0))
    s.submit().wait()
    with ck.load(2) as ld:
        assert ld.info("w").policy == "sharded"
        assert same_bits(ld.read("w"), a)


# ------------------------------------------------------------------ blobs

def test_blobs(ck, rng):
    raw = rng.integers(0, 256, size=5000, dtype=np.uint8).tobytes()
    ba = bytearray(raw[:1000])
    arr = random_array(rng, np.float64, (9,))
    s = ck.begin(1)
    s.add_blob("b/bytes", raw)
    s.add_blob("b/bytearray", ba)
    s.add_blob("b/memoryview", memoryview(arr))          # a format of 8 bytes per item
    s.add_blob("b/readonly_view", memoryview(raw)[10:20])
    s.add_blob("b/empty", b"")
    s.add_blob("b/mine", b"rank zero's", policy="rank-bound")
    s.add("t", arr)
    s.submit()
    s.wait_snapshot()
    ba[:] = b"\0" * len(ba)                              # after the snapshot point
    s.wait()
    with ck.load(1) as ld:
        assert ld.blob("b/bytes") == raw
        assert ld.blob("b/bytearray") == raw[:1000]
        assert ld.blob("b/memoryview") == arr.tobytes()
        assert ld.blob("b/readonly_view") == raw[10:20]
        assert ld.blob("b/empty") == b""
        assert ld.blob("b/mine") == b"rank zero's"
        assert ld.blob("b/mine", saved_rank=0) == b"rank zero's"
        info = ld.info("b/mine")
        assert info.is_blob and info.policy == "rank-bound"
        assert ld.info("b/bytes").logical_bytes == len(raw)
        assert sorted(ld.names()) == sorted(["b/bytes", "b/bytearray", "b/memoryview",
                                             "b/readonly_view", "b/empty", "b/mine", "t"])
        with pytest.raises(libckpt.DTypeError, match="'t'"):
            ld.blob("t")                                 # a tensor, not a blob
        with pytest.raises(libckpt.NotFoundError, match="nope"):
            ld.blob("nope")


# ------------------------------------------------------------------ listing

def test_listing(ck, rng):
    assert ck.steps() == [] and ck.latest is None
    a = random_array(rng, np.float32, (16,))
    for step in (10, 20, 30):
        ck.save(step, {"a": a}, wait=True)
    s = ck.begin(40)                          # closed before submit: aborted
    s.add("a", a)
    s.close()
    assert [i.step for i in ck.steps()] == [10, 20, 30]
    assert ck.latest == 30
    assert all(i.state == "committed" and i.ntensors == 1 and i.world == 1
               and i.logical_bytes == a.nbytes and i.commit_time for i in ck.steps())
    assert ck.step().step == 30
    assert ck.step(20).state == "committed"
    every = {i.step: i for i in ck.steps(all=True)}
    assert sorted(every) == [10, 20, 30, 40]
    assert every[40].state == "aborted"
    assert ck.step(40).state == "aborted"
    with ck.load() as ld:
        assert ld.step == 30
    with pytest.raises(libckpt.NotFoundError):
        ck.load(40)                           # aborted steps do not load


# ------------------------------------------------------------------ errors

def test_not_found(ck):
    with pytest.raises(libckpt.NotFoundError):
        ck.load()                             # nothing committed yet
    ck.save(1, {"w": np.ones(3)}, wait=True)
    with pytest.raises(libckpt.NotFoundError, match="99") as ei:
        ck.load(99)
    assert isinstance(ei.value, LookupError)
    assert ei.value.code == -1004 and ei.value.code_name
    with pytest.raises(libckpt.NotFoundError, match="99"):
        ck.step(99)
    with ck.load(1) as ld:
        with pytest.raises(libckpt.NotFoundError, match="missing"):
            ld.read("missing")


def test_step_exists(ck):
    ck.save(5, {"w": np.ones(3)}, wait=True)
    with pytest.raises(libckpt.StepExistsError, match="5") as ei:
        ck.save(5, {"w": np.ones(3)})
    e = ei.value
    assert isinstance(e, FileExistsError) and isinstance(e, libckpt.CheckpointError)
    assert e.errno == errno.EEXIST and e.code == -errno.EEXIST
    assert e.code_name and e.code_name != libckpt.NotFoundError("", -1004).code_name
    s = ck.begin(6)                            # a name added twice
    s.add("w", np.ones(3))
    with pytest.raises(libckpt.StepExistsError, match="'w'"):
        s.add("w", np.ones(3))
    s.close()


@pytest.mark.parametrize("bad", ["", "/a", "a//b", "a/../b", "a/\ud800"])
def test_invalid_names(ck, bad):
    s = ck.begin(1)
    with pytest.raises(libckpt.InvalidNameError) as ei:
        s.add(bad, np.ones(2))
    assert isinstance(ei.value, ValueError) and ei.value.code == -1007
    if bad:
        assert repr(bad)[1:-1] in str(ei.value) or bad in str(ei.value), str(ei.value)
    with pytest.raises(libckpt.InvalidNameError):
        s.add_blob(bad, b"x")
    s.close()


def test_dtype_errors(ck):
    torch = sys.modules.get("torch")
    s = ck.begin(1)
    with pytest.raises(libckpt.DTypeError, match="'c'"):
        s.add("c", np.ones(3, dtype=np.complex64))
    with pytest.raises(libckpt.DTypeError, match="'w'"):
        s.add("w", np.ones(3, dtype=np.float32), dtype="f64")   # width differs
    if torch is not None:
        with pytest.raises(libckpt.DTypeError, match="complex"):
            s.add("c", torch.ones(3, dtype=torch.complex64))
    s.add("w", np.ones((2, 3), dtype=np.float32))
    s.submit().wait()
    with ck.load(1) as ld:
        with pytest.raises(libckpt.DTypeError, match="'w'") as ei:
            ld.read("w", dtype="f64")                           # the library's check
        assert ei.value.code == -1009 and isinstance(ei.value, TypeError)
        with pytest.raises(libckpt.DTypeError, match="'w'"):
            ld.read("w", out=np.empty((2, 3), dtype=np.float64))
        if torch is not None:
            with pytest.raises(libckpt.DTypeError, match="'w'"):
                ld.read("w", out=torch.empty((2, 3), dtype=torch.int32))


def test_shape_errors(ck):
    ck.save(1, {"w": np.ones((4, 5), dtype=np.float32)}, wait=True)
    with ck.load(1) as ld:
        with pytest.raises(libckpt.ShapeError, match="'w'"):
            ld.read("w", out=np.empty((5, 4), dtype=np.float32))
        with pytest.raises(libckpt.ShapeError, match="'w'") as ei:
            ld.read("w", offset=(2, 0), extent=(3, 5))         # the library's check
        assert ei.value.code == -1008 and isinstance(ei.value, ValueError)
        with pytest.raises(libckpt.ShapeError, match="'w'"):
            ld.read("w", offset=(0, 6))
        # a box of another rank than the tensor's: refused, never read past it
        with pytest.raises(libckpt.ShapeError, match="'w'"):
            ld.read("w", offset=(1,), extent=(2,))
        with pytest.raises(libckpt.ShapeError, match="'w'"):
            ld.read("w", offset=(0, 0, 0), extent=(1, 1, 1))
    s = ck.begin(2)
    with pytest.raises(libckpt.ShapeError, match="'x'"):
        s.add("x", np.ones((3, 3)), policy="sharded", global_shape=(2, 3))
    with pytest.raises(libckpt.ShapeError, match="'x'"):
        s.add("x", np.ones((3, 3)), policy="sharded", global_shape=(6, 3), offset=(4, 0))
    s.close()


def test_state_errors(tmp_path):
    ck = libckpt.Checkpointer(tmp_path / "root")
    s = ck.begin(1)
    with pytest.raises(libckpt.StateError):
        s.wait()                              # not submitted
    with pytest.raises(libckpt.StateError):
        s.wait_snapshot()
    assert not s.done()
    s.add("w", np.ones(3))
    s.submit()
    with pytest.raises(libckpt.StateError) as ei:
        s.add("v", np.ones(3))                # after submit
    assert ei.value.code == -1015 and "state" in ei.value.code_name
    with pytest.raises(libckpt.StateError):
        s.submit()
    s.wait()
    s.close()
    with pytest.raises(libckpt.StateError, match="step 1"):
        s.add("v", np.ones(3))                # on a closed Save
    with pytest.raises(libckpt.StateError):
        s.wait()
    ld = ck.load(1)
    ld.close()
    with pytest.raises(libckpt.StateError, match="step 1"):
        ld.read("w")
    with pytest.raises(libckpt.StateError):
        ld.blob("w")
    ld2 = ck.load(1)
    ck.close()
    ck.close()                                # idempotent
    assert ck.closed
    with pytest.raises(libckpt.StateError):
        ld2.read("w")                         # closed with its Checkpointer
    for call in (lambda: ck.begin(2), lambda: ck.load(1), ck.steps, lambda: ck.latest,
                 lambda: ck.step(1)):
        with pytest.raises(libckpt.StateError, match="closed"):
            call()


def test_wait_before_submit_keeps_the_arrays(ck):
    """A wait() refused before submit records no outcome and keeps the arrays."""
    s = ck.begin(1)
    s.add("w", np.arange(5.0))
    with pytest.raises(libckpt.StateError):
        s.wait(timeout=0)
    assert not s.done() and s._keep
    s.submit()
    s.wait()
    assert s.done()
    with ck.load(1) as ld:
        assert list(ld.read("w")) == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_not_root(tmp_path):
    d = tmp_path / "not-a-root"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    with pytest.raises(libckpt.NotRootError, match="not-a-root") as ei:
        libckpt.Checkpointer(d)
    assert ei.value.code == -1010
    assert (d / "notes.txt").read_text() == "mine"


def test_read_only(tmp_path):
    root = tmp_path / "root"
    with libckpt.Checkpointer(root) as ck:
        ck.save(1, {"w": np.arange(4, dtype=np.int64)}, wait=True)
    with libckpt.Checkpointer(root, read_only=True) as ro:
        assert ro.read_only and ro.latest == 1
        with pytest.raises(libckpt.StateError):
            ro.begin(2)
        with pytest.raises(libckpt.StateError):
            ro.save(2, {"w": np.arange(4)})
        with ro.load() as ld:
            assert list(ld.read("w")) == [0, 1, 2, 3]
    with pytest.raises(libckpt.MissingFileError):
        libckpt.Checkpointer(tmp_path / "absent", read_only=True)


def test_manifest_dir_apart(tmp_path, rng):
    """manifest_dir= keeps the manifest out of the root (its own field of struct
    ckpt_opts: the library honours it, so the field sits where the C struct has it);
    another root is refused it, naming both; a relative one is refused."""
    root, mdir = tmp_path / "shared" / "root", tmp_path / "local" / "m"
    a = random_array(rng, np.float32, (33, 17))
    with libckpt.Checkpointer(root, manifest_dir=mdir) as ck:
        ck.save(1, {"a": a}, wait=True)
    assert (mdir / "data.mdb").is_file()
    assert not (root / "manifest").exists(), sorted(os.listdir(root))
    with libckpt.Checkpointer(root, manifest_dir=mdir, read_only=True) as ro:
        assert ro.latest == 1
        with ro.load() as ld:
            assert same_bits(ld.read("a"), a)
    other = tmp_path / "shared" / "other"
    with pytest.raises(libckpt.NoManifestError) as ei:
        libckpt.Checkpointer(other, manifest_dir=mdir)
    assert str(root) in str(ei.value) and str(other) in str(ei.value), str(ei.value)
    with pytest.raises(ValueError, match="absolute"):
        libckpt.Checkpointer(root, manifest_dir="local/m")


def test_target_passed_through(tmp_path):
    """target= reaches the library as it is: its own checks answer."""
    with pytest.raises(ValueError, match="ckptd://HOST:PORT"):
        libckpt.Checkpointer(tmp_path / "root", target="tcp://h:1")
    with pytest.raises(ValueError, match="with a ckptd target"):
        libckpt.Checkpointer(tmp_path / "root", target="ckptd://h:1",
                             manifest_dir=tmp_path / "m")


def test_corrupt_shard(tmp_path, rng):
    root = tmp_path / "root"
    a = random_array(rng, np.float32, (64, 1024))          # 256 KiB of data
    with libckpt.Checkpointer(root, chunk_bytes=4096) as ck:
        ck.save(1, {"a": a}, wait=True)
    shards = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
              if f.endswith(".shard")]
    assert shards, f"no .shard file under {root}"
    for path in shards:
        size = os.path.getsize(path)
        assert size > a.nbytes // 2
        with open(path, "r+b") as f:                       # the middle: chunk data
            f.seek(size // 2)
            byte = f.read(1)
            f.seek(size // 2)
            f.write(bytes([byte[0] ^ 0x10]))
    with libckpt.Checkpointer(root) as ck:
        with ck.load(1) as ld:
            with pytest.raises((libckpt.CorruptError, libckpt.FormatError)) as ei:
                ld.read("a")
            assert "'a'" in str(ei.value) or ".shard" in str(ei.value), str(ei.value)
            # the chunks before the flipped one still read
            assert same_bits(ld.read("a", offset=(0, 0), extent=(1, 1024)), a[:1])


def run_python(code, env_extra=None, timeout=120):
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_wait_timeout_and_done(tmp_path):
    """With the shard's fdatasync held back 1.5 s (a fault point), wait(timeout=0)
    times out and done() is False until the commit; then both report it."""
    r = run_python(f"""
        import errno, numpy as np, libckpt
        ck = libckpt.Checkpointer({str(tmp_path / "root")!r})
        s = ck.begin(1)
        assert not s.done()
        s.add("w", np.arange(1000, dtype=np.float32))
        s.submit()
        s.wait_snapshot()
        try:
            s.wait(timeout=0)
            raise SystemExit("wait(timeout=0) returned while the save was held back")
        except libckpt.CheckpointTimeoutError as e:
            assert isinstance(e, TimeoutError) and e.errno == errno.ETIMEDOUT, e
        assert not s.done()
        st = s.wait()
        assert st.logical_bytes == 4000, st
        assert s.done()
        assert s.wait(timeout=0).logical_bytes == 4000
        assert ck.latest == 1
        ck.close()
        print("ok")
        """, {"CKPT_FAULT": "before_fdatasync:1:delay:1500"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_handle_keeps_arrays_alive(tmp_path):
    """The caller drops its arrays right after submit while the save is held back
    (a small pool and a slow first chunk): the handle keeps them alive until the
    snapshot point, and the step loads bit-exact. Were they freed, the copy would
    read unmapped or reused memory."""
    r = run_python(f"""
        import gc, numpy as np, libckpt
        ck = libckpt.Checkpointer({str(tmp_path / "root")!r}, chunk_bytes=4096,
                                  pool_bytes=65536)
        rng = np.random.default_rng({SEED})
        want = {{}}
        s = ck.begin(1)
        for i in range(4):
            a = rng.integers(-2**62, 2**62, size=(1 << 17,))     # 1 MiB each
            want[i] = a.tobytes()
            s.add(f"a{{i}}", a)
            t = a[::2]                                           # a contiguous copy
            want[f"s{{i}}"] = t.tobytes()
            s.add(f"s{{i}}", t)
        del a, t
        s.submit()
        gc.collect()
        junk = [np.full(1 << 17, -1, dtype=np.int64) for _ in range(16)]
        s.wait_snapshot()
        del junk
        s.wait()
        with ck.load(1) as ld:
            for i in range(4):
                assert ld.read(f"a{{i}}").tobytes() == want[i], i
                assert ld.read(f"s{{i}}").tobytes() == want[f"s{{i}}"], i
        ck.close()
        print("ok")
        """, {"CKPT_FAULT": "after_chunk_write:1:delay:300"})
    assert r.returncode == 0 and "ok" in r.stdout, \
        f"rc {r.returncode}\n{r.stdout}{r.stderr}"


# ------------------------------------------------------------------ the tools

def test_module_help_finds_the_tools():
    r = run_python("import sys, libckpt.__main__ as m; sys.argv[0] = 'x'; "
                   "raise SystemExit(m.main(['--help']))")
    assert r.returncode == 0, r.stderr
    for exe in ("ckpt-inspect", "ckpt-reshard", "ckpt-synth"):
        lines = [ln.strip() for ln in r.stdout.splitlines()]
        paths = [ln[1:-1] for ln in lines if ln.startswith("(") and ln.endswith(exe + ")")]
        assert paths, f"{exe}: no path in\n{r.stdout}"
        assert os.access(paths[0], os.X_OK), paths[0]
    r = subprocess.run([sys.executable, "-m", "libckpt", "--version"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and libckpt.library_version in r.stdout, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "libckpt", "nosuchtool"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "nosuchtool" in r.stderr


def test_module_skips_a_directory_named_as_the_tool(tmp_path):
    """LIBCKPT_TOOLS_DIR naming a folder that holds a directory of a tool's name (a
    build tree's tools/, whose tools/ckpt-inspect/ holds the binary): the directory
    is passed over for the next place, never exec'd."""
    for exe in ("ckpt-inspect", "ckpt-reshard", "ckpt-synth"):
        (tmp_path / exe).mkdir()
    env = dict(os.environ, LIBCKPT_TOOLS_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "libckpt", "--help"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert str(tmp_path) not in r.stdout, r.stdout
    r = subprocess.run([sys.executable, "-m", "libckpt", "inspect", "--help"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "diff" in r.stdout, r.stdout + r.stderr


def test_module_runs_inspect(tmp_path, rng):
    root = tmp_path / "root"
    with libckpt.Checkpointer(root) as ck:
        for step in (3, 8):
            ck.save(step, {"w": random_array(rng, np.float32, (8,))}, wait=True)
    r = subprocess.run([sys.executable, "-m", "libckpt", "inspect", str(root), "list"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    steps = [ln.split()[0] for ln in r.stdout.splitlines()[1:] if ln.strip()]
    assert steps == ["3", "8"], r.stdout
    r = subprocess.run([sys.executable, "-m", "libckpt", "inspect", str(root), "show",
                        "9"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "9" in r.stdout + r.stderr


@pytest.mark.parametrize("compress", ["bytegroup", "bytegroup:3", "zstd:1", 0])
def test_compress(tmp_path, rng, compress):
    # Trained-like weights: bytegroup and zstd store less than raw, and every
    # dtype (with and without byte planes) reads back bit for bit.
    w = (rng.standard_normal((512, 300)) * 0.02).astype(np.float32)
    arrays = {"w": w, "w64": w.astype(np.float64), "w16": w.astype(np.float16),
              "i": rng.integers(0, 5, 70001).astype(np.int32)}
    with libckpt.Checkpointer(tmp_path / "root", compress=compress, compress_threads=2,
                              chunk_bytes=65536) as ck:
        ck.save(1, arrays, wait=True)
        info = ck.steps()[0]
        if compress:
            assert info.stored_bytes < info.logical_bytes
        else:
            assert info.stored_bytes == info.logical_bytes
        with ck.load(1) as ld:
            for k, a in arrays.items():
                assert same_bits(ld.read(k), a), k


def test_compress_bad(tmp_path):
    for bad in ("lz4", "bytegroup:0", "bytegroup:x", "none:1", "zstd:23"):
        with pytest.raises(ValueError):
            libckpt.Checkpointer(tmp_path / "root", compress=bad)
    with pytest.raises(ValueError):
        libckpt.Checkpointer(tmp_path / "root", compress_threads=0)
