"""libckpt from Python on a CUDA device: stream ordering of device tensors, every
dtype to and from device memory, and a CUDA model resumed bit for bit."""
import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

import libckpt.torch as lt  # noqa: E402

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.fixture
def ck(tmp_path):
    with lt.open(str(tmp_path / "root")) as c:
        if not c.cuda_available:
            pytest.skip("libckpt was built without CUDA or cannot load the runtime")
        yield c


def test_save_sees_work_queued_before_and_not_after(ck):
    dev = torch.device("cuda")
    a = torch.randn(4096, 4096, device=dev)
    t = torch.zeros(64, 1 << 20, device=dev)          # 256 MiB
    torch.cuda.synchronize()
    for _ in range(3):
        a = a @ a / 64.0                               # keep the stream busy
    t.fill_(1.0)                                       # queued, not finished
    s = ck.begin(1)
    s.add("t", t)
    s.submit()                                         # no synchronize: the save orders
    s.wait_snapshot()
    t.fill_(2.0)                                       # after the snapshot point
    s.wait()
    with ck.load(1) as ld:
        host = ld.read("t")
        assert (host == 1.0).all()
        back = torch.empty_like(t)
        ld.read("t", back)
        assert bool((back == 1.0).all())


def test_every_dtype_through_device_memory(ck):
    gen = torch.Generator(device="cuda").manual_seed(int(os.environ.get("CKPT_TEST_SEED",
                                                                        "1")))
    dtypes = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
    dtypes += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2")
               if hasattr(torch, n)]
    src = {}
    for d in dtypes:
        raw = torch.randint(0, 256, (33, 17 * torch.empty((), dtype=d).element_size()),
                            device="cuda", dtype=torch.uint8, generator=gen)
        src[str(d)] = raw.view(d) if d != torch.bool else raw.bool()
    src["strided"] = torch.randn(64, 32, device="cuda", generator=gen)[:, ::2]
    lt.save(ck, 2, {"extra": src}).wait()
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    lt.load(ck, {"extra": dst})
    for k, v in src.items():
        assert dst[k].is_cuda
        a, b = v.contiguous(), dst[k].contiguous()
        if a.dtype != torch.bool:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        assert torch.equal(a, b), k


def test_cuda_model_resumes_bit_exactly(ck):
    torch.use_deterministic_algorithms(True)
    try:
        def make(seed):
            torch.manual_seed(seed)
            m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                    torch.nn.Linear(256, 64)).cuda()
            return m, torch.optim.Adam(m.parameters(), lr=1e-3)

        def step(m, o):
            x = torch.randn(16, 64, device="cuda")
            loss = m(x).pow(2).mean()
            o.zero_grad()
            loss.backward()
            o.step()
            return loss.item()

        m, o = make(0)
        torch.manual_seed(5)
        for _ in range(3):
            step(m, o)
        lt.save(ck, 3, {"model": m, "optim": o, "rng": lt.RNGState()}).wait()
        ref = [step(m, o) for _ in range(4)]
        m2, o2 = make(1)
        lt.load(ck, {"model": m2, "optim": o2, "rng": lt.RNGState()})
        assert all(p.is_cuda for p in m2.parameters())
        assert [step(m2, o2) for _ in range(4)] == ref
    finally:
        torch.use_deterministic_algorithms(False)


def test_device_pool_releases_after_device_copies(tmp_path):
    """device_pool_bytes: the snapshot point comes after the device-to-device copies;
    an overwrite right after it leaves the checkpoint with the old values; an
    incremental step finds the unchanged tensor unchanged on the device."""
    with lt.open(str(tmp_path / "pool"), device_pool_bytes=128 << 20, pool_bytes=8 << 20,
                 chunk_bytes=1 << 20, incremental=True) as c:
        if not c.cuda_available:
            pytest.skip("libckpt was built without CUDA or cannot load the runtime")
        gen = torch.Generator(device="cuda").manual_seed(7)
        w = torch.randn(4 << 20, device="cuda", generator=gen)      # 16 MiB
        m = torch.randn(4 << 20, device="cuda", generator=gen)
        want_w, want_m = w.clone(), m.clone()
        h = lt.save(c, 1, {"model": {"w": w, "m": m}})
        h.wait_snapshot()
        w.fill_(3.0)
        m.fill_(4.0)
        st = h.wait()
        assert st.device_staged_bytes >= 32 << 20             # and the structure record
        got = {"w": torch.zeros_like(w), "m": torch.zeros_like(m)}
        lt.load(c, {"model": got}, step=1)
        assert torch.equal(got["w"], want_w) and torch.equal(got["m"], want_m)
        st2 = lt.save(c, 2, {"model": {"w": w, "m": m}}).wait()   # both changed
        assert st2.device_unchanged_bytes == 0
        w.add_(1.0)                                                 # m unchanged
        st3 = lt.save(c, 3, {"model": {"w": w, "m": m}}).wait()
        assert st3.device_unchanged_bytes == 16 << 20
        assert st3.referenced_bytes >= 16 << 20
        lt.load(c, {"model": got}, step=3)
        assert torch.equal(got["w"], w) and torch.equal(got["m"], m)
