"""libckpt.torch on the CPU: whole training states saved and loaded in place, and
training resumed bit for bit."""
import math
import os

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import libckpt  # noqa: E402
import libckpt.torch as lt  # noqa: E402

SEED = int(os.environ.get("CKPT_TEST_SEED", "1"))


class Block(torch.nn.Module):
    """A small transformer block: attention, layer norms, an MLP."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.att = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(d)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                      torch.nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.att(h, h, h, need_weights=False)[0]
        return x + self.ff(self.ln2(x))


def make(seed):
    torch.manual_seed(seed)
    m = Block()
    o = torch.optim.Adam(m.parameters(), lr=1e-3)
    s = torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5)
    return m, o, s


def train_step(m, o, s):
    # the batch comes from the global RNG, so resuming must restore it too
    x = torch.randn(4, 8, 32)
    y = torch.randn(4, 8, 32)
    loss = torch.nn.functional.mse_loss(m(x), y)
    o.zero_grad()
    loss.backward()
    o.step()
    s.step()
    return loss.item()


@pytest.fixture
def ck(tmp_path):
    with lt.open(str(tmp_path / "root")) as c:
        yield c


def test_resume_is_bit_exact(ck):
    m, o, s = make(SEED)
    torch.manual_seed(SEED + 1)
    for _ in range(4):
        train_step(m, o, s)
    state = {"model": m, "optim": o, "sched": s, "rng": lt.RNGState(), "step": 4}
    h = lt.save(ck, 4, state)
    h.wait_snapshot()
    h.wait()
    uninterrupted = [train_step(m, o, s) for _ in range(6)]

    m2, o2, s2 = make(SEED + 99)           # other weights, a fresh optimizer
    torch.manual_seed(12345)               # another RNG position
    state2 = {"model": m2, "optim": o2, "sched": s2, "rng": lt.RNGState(), "step": 0}
    assert lt.load(ck, state2) == 4
    assert state2["step"] == 4
    resumed = [train_step(m2, o2, s2) for _ in range(6)]
    assert resumed == uninterrupted
    for (n1, p1), (n2, p2) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1


def test_kinds_and_policies_in_the_catalog(ck):
    m, o, s = make(SEED)
    train_step(m, o, s)
    lt.save(ck, 1, {"model": m, "optim": o, "sched": s, "rng": lt.RNGState()}).wait()
    with ck.load(1) as ld:
        kinds = {i.name.split("/")[0]: i.kind for i in ld.items() if
                 not i.name.startswith(".libckpt")}
        assert kinds == {"model": "model", "optim": "optimizer", "rng": "rng"}
        rng = [i for i in ld.items() if i.name.startswith("rng/")]
        assert rng and all(i.policy == "rank-bound" for i in rng)
        assert ld.info(".libckpt/structure/sched").kind == "scheduler"
        assert ld.info("model/ff.0.weight").shape == (128, 32)


def test_plain_values_are_data_not_pickle(ck):
    value = {
        "int": 7, "big": 2**80 + 1, "neg": -(2**63), "float": 0.1, "nan": float("nan"),
        "inf": -math.inf, "negzero": -0.0, "str": "héllo ✓", "bytes": b"\x00\xff",
        "none": None, "bool": True, "tuple": (1, (2.5, "x"), []), "list": [1, [2, {}]],
        "intkeys": {0: "a", 17: {"b": 1}}, "dtype": torch.bfloat16,
        "size": torch.Size([2, 3]), "np_u32": np.arange(5, dtype=np.uint32) * 2**30,
        "np_f16": np.ones((2, 2), np.float16), "np_scalar": np.int64(-4),
    }
    lt.save(ck, 1, {"extra": value}).wait()
    with ck.load(1) as ld:
        text = ld.blob(".libckpt/structure/extra")
        assert b"pickle" not in text
    out = {"extra": {}}
    lt.load(ck, out)
    got = out["extra"]
    assert set(got) == set(value)
    for k in ("int", "big", "neg", "float", "str", "bytes", "none", "bool", "tuple",
              "list", "intkeys", "dtype", "size"):
        assert got[k] == value[k] and type(got[k]) is type(value[k]), k
    assert math.isnan(got["nan"]) and got["inf"] == -math.inf
    assert math.copysign(1, got["negzero"]) == -1
    assert got["np_u32"].dtype == np.uint32 and (got["np_u32"] == value["np_u32"]).all()
    assert got["np_f16"].dtype == np.float16 and (got["np_f16"] == 1).all()
    assert got["np_scalar"] == -4 and isinstance(got["np_scalar"], np.int64)


class Thing:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, Thing) and other.v == self.v


def test_objects_need_allow_pickle(ck):
    with pytest.raises(TypeError, match=r"state\['extra'\]\['obj'\].*allow_pickle"):
        lt.save(ck, 1, {"extra": {"obj": Thing(3)}})
    assert ck.steps() == []                # nothing was committed, nothing left in flight
    lt.save(ck, 2, {"extra": {"obj": Thing(3)}}, allow_pickle=True).wait()
    out = {"extra": {}}
    with pytest.raises(libckpt.DTypeError, match="allow_pickle"):
        lt.load(ck, out)
    lt.load(ck, out, allow_pickle=True)
    assert out["extra"]["obj"] == Thing(3)


DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
DTYPES += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


def _random_tensor(dtype, shape, gen):
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    raw = torch.randint(0, 256, shape + (torch.empty((), dtype=dtype).element_size(),),
                        generator=gen, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)   # every bit pattern: NaNs, denormals, ...


def test_every_dtype_in_place(ck):
    gen = torch.Generator().manual_seed(SEED)
    src = {str(d): _random_tensor(d, (3, 5), gen) for d in DTYPES}
    src["scalar"] = torch.tensor(3.5)
    src["empty"] = torch.empty(0, 4)
    src["transposed"] = torch.arange(12.0).reshape(3, 4).t()
    src["complex"] = torch.randn(2, 3, dtype=torch.complex64, generator=gen)
    lt.save(ck, 1, {"extra": src}).wait()
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    dst["transposed"] = torch.zeros(3, 4).t()          # non-contiguous destination
    before = {k: v.data_ptr() for k, v in dst.items()}
    lt.load(ck, {"extra": dst})
    for k, v in src.items():
        assert dst[k].data_ptr() == before[k], f"{k} was not loaded in place"
        a, b = v.contiguous(), dst[k].contiguous()
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.is_complex():
            a, b = torch.view_as_real(a), torch.view_as_real(b)
        if a.dtype != torch.bool:            # compare bits: NaNs are equal to themselves
            a, b = a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
        assert torch.equal(a, b), k


def test_bad_destinations_raise(ck):
    m, o, s = make(SEED)
    lt.save(ck, 1, {"model": m}).wait()
    # shape
    class Wider(Block):
        def __init__(self):
            super().__init__(d=48, heads=4)
    with pytest.raises(libckpt.ShapeError, match=r"model/.*shape"):
        lt.load(ck, {"model": Wider()})
    # dtype: never silently converted
    with pytest.raises(libckpt.DTypeError, match="f32"):
        lt.load(ck, {"model": Block().to(torch.float64)})
    # a part the checkpoint lacks
    with pytest.raises(libckpt.NotFoundError, match="optim"):
        lt.load(ck, {"model": Block(), "optim": o})
    m3 = Block()
    lt.load(ck, {"model": m3, "optim": {}}, strict=False)
    assert torch.equal(m3.ff[0].weight, m.ff[0].weight)
    # a missing key in the model: load_state_dict's strictness applies
    sd = {"extra": {"a": torch.ones(2)}}
    lt.save(ck, 2, sd).wait()
    with pytest.raises(libckpt.NotFoundError):
        lt.load(ck, {"extra": {}}, step=3)
    # wrong kinds of state
    with pytest.raises(TypeError):
        lt.save(ck, 3, [m])
    with pytest.raises(TypeError, match="key"):
        lt.save(ck, 3, {"extra": {(1, 2): 3}})
    with pytest.raises(libckpt.DTypeError, match=r"extra.*'q'.*qint8"):
        lt.save(ck, 3, {"extra": {"q": torch.quantize_per_tensor(
            torch.zeros(2), 0.1, 0, torch.qint8)}})
    ck.close()
    with pytest.raises(libckpt.StateError, match="closed"):
        lt.save(ck, 4, {"model": m})
    with pytest.raises(libckpt.StateError, match="closed"):
        lt.load(ck, {"model": m})


def test_keys_that_break_name_rules_are_escaped(ck):
    odd = {"a/b": torch.ones(1), "": torch.zeros(1), ".": torch.full((1,), 2.0),
           "..": torch.full((1,), 3.0), "%": torch.full((1,), 4.0),
           "tab\tkey": torch.full((1,), 5.0), ".hidden": torch.full((1,), 6.0)}
    lt.save(ck, 1, {"extra": odd}).wait()
    out = {"extra": {}}
    lt.load(ck, out)
    assert set(out["extra"]) == set(odd)
    for k, v in odd.items():
        assert torch.equal(out["extra"][k], v), k


def test_save_handle_and_metadata(ck):
    m, _, _ = make(SEED)
    if not libckpt.core._lib.has("ckpt_save_set_meta"):
        pytest.skip("this libckpt has no step metadata")
    h = lt.save(ck, 10, {"model": m}, meta={"loss": 1.25, "tokens": 10**12})
    h.wait()
    assert h.done()
    assert ck.meta(10) == {"loss": 1.25, "tokens": 10**12}
    assert ck.steps()[0].meta == {"loss": 1.25, "tokens": 10**12}
