"""Incremental saves from Python: the Checkpointer's incremental= (and its default,
CKPT_INCREMENTAL), one save's choice through save(incremental=), Save.set_incremental
and libckpt.torch.save(incremental=); what each step stores, and every step loading
bit for bit whatever it references.

Run by tests/python/run_pytest.sh (ctest python_incremental). Data come from
CKPT_TEST_SEED, printed with each failing test's output.
"""
import os
import time

import pytest

np = pytest.importorskip("numpy")
import libckpt  # noqa: E402

if not libckpt._lib.has("ckpt_save_set_incremental"):
    pytest.skip("this libckpt has no incremental saves", allow_module_level=True)

SEED = int(os.environ.get("CKPT_TEST_SEED") or int(time.time()))


@pytest.fixture
def rng(request):
    print(f"CKPT_TEST_SEED={SEED}")
    return np.random.default_rng([SEED, sum(map(ord, request.node.name))])


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv("CKPT_INCREMENTAL", raising=False)


def states(rng, n=4):
    """n states of "a" (new at every step) and "b" (the same at every step)."""
    b = rng.standard_normal((256, 64), dtype=np.float32)
    return [{"a": rng.standard_normal((128, 64), dtype=np.float32), "b": b}
            for _ in range(n)]


def stored(ck, step):
    return ck.step(step).stored_bytes


def check(ck, step, want):
    with ck.load(step) as ld:
        for name, arr in want.items():
            got = ld.read(name)
            assert got.tobytes() == arr.tobytes(), f"step {step}: {name} differs"


def test_root_option_and_one_save(tmp_path, rng):
    st = states(rng)
    a, b = st[0]["a"].nbytes, st[0]["b"].nbytes
    with libckpt.Checkpointer(str(tmp_path / "r"), incremental=True) as ck:
        ck.save(1, st[0], wait=True)
        ck.save(2, st[1], wait=True)                       # "b" referenced
        ck.save(3, st[2], incremental=False, wait=True)    # this one whole
        s = ck.begin(4)
        s.add("a", st[3]["a"])
        s.add("b", st[3]["b"])
        s.set_incremental(True)
        s.submit()
        s.wait()
        assert stored(ck, 1) == a + b
        assert stored(ck, 2) == a
        assert stored(ck, 3) == a + b
        assert stored(ck, 4) == a
        for step in range(1, 5):
            check(ck, step, st[step - 1])
    # A fresh Checkpointer (nothing carried in memory) reads them all too.
    with libckpt.Checkpointer(str(tmp_path / "r"), read_only=True) as ck:
        for step in range(1, 5):
            check(ck, step, st[step - 1])


def test_default_is_the_environment_then_off(tmp_path, rng, monkeypatch):
    st = states(rng, 3)
    a, b = st[0]["a"].nbytes, st[0]["b"].nbytes
    with libckpt.Checkpointer(str(tmp_path / "r")) as ck:
        ck.save(1, st[0], wait=True)
        ck.save(2, st[1], wait=True)
        assert stored(ck, 2) == a + b                      # off by default
    monkeypatch.setenv("CKPT_INCREMENTAL", "1")
    with libckpt.Checkpointer(str(tmp_path / "r")) as ck:
        ck.save(3, st[2], wait=True)
        assert stored(ck, 3) == a
    with libckpt.Checkpointer(str(tmp_path / "r"), incremental=False) as ck:
        ck.save(4, st[2], wait=True)                       # the option wins
        assert stored(ck, 4) == a + b
        for step in (1, 2, 3):
            check(ck, step, st[step - 1])


def test_bad_values(tmp_path, rng):
    with pytest.raises(TypeError):
        libckpt.Checkpointer(str(tmp_path / "r"), incremental="no")
    with libckpt.Checkpointer(str(tmp_path / "r")) as ck:
        s = ck.begin(1)
        with pytest.raises(TypeError):
            s.set_incremental(2)
        s.add("a", states(rng, 1)[0]["a"])
        s.submit()
        s.wait()
        with pytest.raises(libckpt.CheckpointError):
            s.set_incremental(True)                        # after submit: CKPT_ESTATE


def test_torch_state(tmp_path):
    torch = pytest.importorskip("torch")
    import libckpt.torch as lt
    torch.manual_seed(SEED)
    emb = torch.nn.Embedding(512, 64)                      # frozen: unchanged
    emb.weight.requires_grad_(False)
    head = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    model = torch.nn.Sequential(emb, head)
    with libckpt.Checkpointer(str(tmp_path / "r")) as ck:
        saved = {}
        for step in (1, 2):
            loss = model(torch.arange(8)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            lt.save(ck, step, {"model": model, "optim": opt}, incremental=True, wait=True)
            saved[step] = {k: v.clone() for k, v in model.state_dict().items()}
        info = ck.step(2)
        assert info.stored_bytes <= info.logical_bytes - emb.weight.numel() * 4, info
        assert ck.step(1).stored_bytes == ck.step(1).logical_bytes
        for step in (1, 2):
            fresh = torch.nn.Sequential(torch.nn.Embedding(512, 64), torch.nn.Linear(64, 64))
            lt.load(ck, {"model": fresh}, step, strict=False)
            for k, v in fresh.state_dict().items():
                assert torch.equal(v, saved[step][k]), f"step {step}: {k}"
