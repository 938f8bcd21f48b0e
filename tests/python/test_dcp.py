"""libckpt.dcp under torch.distributed.checkpoint: dcp.save, dcp.async_save and
dcp.load of model and optimizer state in one process and in gloo jobs of 2 and 4
processes (DTensor shards, loaded with another world size), a checkpoint visible only
once it is committed, and failures that leave nothing behind. Needs torch >= 2.4."""
import os
import re

import pytest

try:
    import torch
except ImportError:
    pytest.skip("torch.distributed.checkpoint StorageWriter needs torch >= 2.4, this is "
                "no torch at all", allow_module_level=True)
_m = re.match(r"(\d+)\.(\d+)", torch.__version__)
if not _m or (int(_m.group(1)), int(_m.group(2))) < (2, 4):
    pytest.skip("torch.distributed.checkpoint StorageWriter needs torch >= 2.4, this is "
                f"{torch.__version__}", allow_module_level=True)
if not torch.distributed.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.default_planner import (  # noqa: E402
    DefaultLoadPlanner, DefaultSavePlanner)

import libckpt  # noqa: E402
import libckpt.dcp as ldcp  # noqa: E402

SEED = int(os.environ.get("CKPT_TEST_SEED", "1"))

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # DCP's no_dist warning


def make(seed):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                            torch.nn.Linear(16, 4))
    o = torch.optim.Adam(m.parameters(), lr=1e-2)
    return m, o


def train(m, o, steps=2):
    for _ in range(steps):
        loss = m(torch.randn(5, 8)).square().mean()
        o.zero_grad()
        loss.backward()
        o.step()


def full_state(m, o, epoch=0, tag=""):
    return {"model": m.state_dict(), "optim": o.state_dict(),
            "extra": {"epoch": epoch, "tag": tag, "raw": b"\x00\xffbytes" if epoch else b"",
                      "nested": {"lr": 0.1 * epoch, "names": ["a", "b"][:epoch % 3]}}}


def assert_same(a, b, path="state"):
    if isinstance(a, dict):
        assert set(a) == set(b), f"{path}: {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{tuple(a.shape)}"
        assert torch.equal(a, b), f"{path} differs"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def committed(root):
    with libckpt.Checkpointer(str(root), read_only=True, rank=0, world=1) as ck:
        return [s.step for s in ck.steps(meta=False)]


def load_into_fresh(root, reader, epoch=7):
    """A fresh model and optimizer (other seed, other values), loaded in place."""
    m2, o2 = make(SEED + 100)
    train(m2, o2, 1)                       # the optimizer has state to load into
    sd = full_state(m2, o2)
    dcp.load(sd, storage_reader=reader)
    m2.load_state_dict(sd["model"])
    o2.load_state_dict(sd["optim"])
    return m2, o2, sd


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "root")


# ------------------------------------------------------------------ one process


def test_save_and_load_bit_exact(root):
    m, o = make(SEED)
    train(m, o)
    sd = full_state(m, o, epoch=7, tag="t\u00e9st")
    with ldcp.Writer(root) as w:
        dcp.save(sd, storage_writer=w, checkpoint_id=5)
    assert committed(root) == [5]
    with libckpt.Checkpointer(root, read_only=True, rank=0, world=1) as ck, ck.load(5) as ld:
        names = set(ld.names())
        assert ldcp.METADATA_ITEM in names
        assert "model.0.weight" in names and "optim.state.0.exp_avg" in names
        assert ld.info("model.0.weight").policy == "sharded"
        assert ld.info("optim.state.0.exp_avg").kind == "optimizer"
    m2, o2, sd2 = load_into_fresh(root, ldcp.Reader(root))
    assert_same(sd2["model"], m.state_dict())
    assert_same(o2.state_dict(), o.state_dict())
    assert_same(sd2["extra"], sd["extra"])
    # training goes on identically from the loaded state
    torch.manual_seed(SEED + 1)
    train(m, o)
    torch.manual_seed(SEED + 1)
    train(m2, o2)
    assert_same(m2.state_dict(), m.state_dict())


def test_with_a_process_group_of_one(root, tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1),
                            rank=0, world_size=1)
    try:
        m, o = make(SEED)
        train(m, o)
        sd = full_state(m, o, epoch=2)
        w = ldcp.Writer(root)
        dcp.save(sd, storage_writer=w)           # no id, no step: latest + 1 = 0
        dcp.save(sd, storage_writer=w)           # 1
        w.close()
        assert committed(root) == [0, 1]
        _, o2, sd2 = load_into_fresh(root, ldcp.Reader(root))
        assert_same(sd2["model"], m.state_dict())
        assert_same(o2.state_dict(), o.state_dict())
    finally:
        dist.destroy_process_group()


def test_async_save(root):
    m, o = make(SEED)
    train(m, o)
    sd = full_state(m, o, epoch=4)
    w = ldcp.Writer(root)
    fut = dcp.async_save(sd, storage_writer=w, checkpoint_id=3)
    fut = getattr(fut, "upload_completion", fut)      # AsyncSaveResponse or a Future
    fut.result()
    w.close()
    assert committed(root) == [3]
    _, o2, sd2 = load_into_fresh(root, ldcp.Reader(root, step=3))
    assert_same(sd2["model"], m.state_dict())
    assert_same(o2.state_dict(), o.state_dict())
    assert_same(sd2["extra"], sd["extra"])


def test_steps_and_checkpoint_ids(root):
    m, o = make(SEED)
    train(m, o)
    with ldcp.Writer(root, step=10) as w:
        dcp.save(full_state(m, o, epoch=1), storage_writer=w)          # step= : 10
        dcp.save(full_state(m, o, epoch=2), storage_writer=w, checkpoint_id="12")
        dcp.save(full_state(m, o, epoch=3), storage_writer=w, checkpoint_id=11)
        with pytest.raises(FileExistsError):           # step 10 is committed already
            try:
                dcp.save(full_state(m, o, epoch=4), storage_writer=w)
            except CheckpointException as e:
                raise next(iter(e.failures.values()))[0]
    assert committed(root) == [10, 11, 12]
    # without an id the reader takes the latest (12), with one that step
    for reader, epoch in ((ldcp.Reader(root), 2), (ldcp.Reader(root, step=10), 1)):
        _, _, sd = load_into_fresh(root, reader)
        assert sd["extra"]["epoch"] == epoch
    m2, o2 = make(SEED)
    sd = full_state(m2, o2)
    dcp.load(sd, storage_reader=ldcp.Reader(root), checkpoint_id=11)
    assert sd["extra"]["epoch"] == 3
    for good in (0, 7, "0", "42"):
        assert ldcp.Writer.validate_checkpoint_id(good), good
        assert ldcp.Reader.validate_checkpoint_id(good), good
    for bad in (-1, 1.5, True, "", "abc", "1e3", "/ckpt/step-3", None):
        assert not ldcp.Writer.validate_checkpoint_id(bad), bad
    with pytest.raises(ValueError, match="step-3"):
        dcp.save(full_state(m, o), storage_writer=ldcp.Writer(root),
                 checkpoint_id="/ckpt/step-3")
    with pytest.raises(ValueError, match="step -2"):
        ldcp.Writer(root, step=-2)
    with pytest.raises(TypeError, match="one of them"):
        ldcp.Reader()


def test_failure_midway_commits_nothing(root):
    m, o = make(SEED)
    train(m, o)

    class Failing(DefaultSavePlanner):
        n = 0

        def resolve_data(self, item):
            Failing.n += 1
            if Failing.n == 3:
                raise RuntimeError("injected: the third item cannot be read")
            return super().resolve_data(item)

    w = ldcp.Writer(root)
    with pytest.raises(CheckpointException) as ei:
        dcp.save(full_state(m, o, epoch=1), storage_writer=w, checkpoint_id=1,
                 planner=Failing())
    assert "injected" in str(ei.value.failures[0][0])
    assert committed(root) == []
    # the step is free again and saves
    dcp.save(full_state(m, o, epoch=1), storage_writer=w, checkpoint_id=1)
    w.close()
    assert committed(root) == [1]


def test_visible_only_when_finish_commits(root):
    """A planner of its own: the coordinator's save is submitted by finish(), so
    nothing is visible before it, and all is after dcp.save returns."""
    seen = []

    class Planner(DefaultSavePlanner):
        def create_global_plan(self, plans):
            return super().create_global_plan(plans)

    class Watching(ldcp.Writer):
        def finish(self, metadata, results):
            seen.append(committed(root))
            super().finish(metadata, results)
            seen.append(committed(root))

    m, o = make(SEED)
    train(m, o)
    sd = full_state(m, o, epoch=5)
    with Watching(root) as w:
        dcp.save(sd, storage_writer=w, checkpoint_id=8, planner=Planner())
    assert seen == [[], [8]]
    _, o2, sd2 = load_into_fresh(root, ldcp.Reader(root))
    assert_same(sd2["model"], m.state_dict())
    assert_same(o2.state_dict(), o.state_dict())
    assert_same(sd2["extra"], sd["extra"])


def test_keys_that_break_name_rules_round_trip(root):
    keys = ["a/b", ".hidden", "..", "x%y", "tab\there", "/lead", "a//b", "\u00e9t\u00e9"]
    sd = {k: torch.full((2, 3), float(i)) for i, k in enumerate(keys)}
    dcp.save(sd, storage_writer=ldcp.Writer(root), checkpoint_id=0)
    with libckpt.Checkpointer(root, read_only=True, rank=0, world=1) as ck, ck.load(0) as ld:
        names = set(ld.names()) - {ldcp.METADATA_ITEM}
    assert sorted(ldcp.fqn_of(n) for n in names) == sorted(keys)
    sd2 = {k: torch.zeros(2, 3) for k in keys}
    dcp.load(sd2, storage_reader=ldcp.Reader(root), planner=DefaultLoadPlanner())
    assert_same(sd2, sd)
    for k in keys:
        n = ldcp.item_name(k)
        assert "/" not in n and not n.startswith(".") and ldcp.fqn_of(n) == k
    with pytest.raises(libckpt.InvalidNameError, match="DCP key ''"):
        ldcp.item_name("")


def test_bad_input_names_the_key(root):
    sd = {"model": {"z": torch.zeros(3, dtype=torch.complex64)}}
    with pytest.raises(CheckpointException) as ei:
        dcp.save(sd, storage_writer=ldcp.Writer(root), checkpoint_id=0)
    err = ei.value.failures[0][0]
    assert isinstance(err, libckpt.DTypeError) and "model.z" in str(err), err
    assert committed(root) == []


def test_no_checkpoint_to_load(root, caplog):
    m, o = make(SEED)
    sd = full_state(m, o)
    os.makedirs(root)
    r = ldcp.Reader(root)
    with pytest.raises(BaseException):
        dcp.load(sd, storage_reader=r)
    assert isinstance(r.last_error, libckpt.CheckpointError), r.last_error
    # the cause is told, although DCP replaces it by its own "metadata is None"
    assert "reading the metadata" in caplog.text


def test_a_given_checkpointer_is_not_closed(root):
    m, o = make(SEED)
    train(m, o)
    sd = full_state(m, o, epoch=1)
    with libckpt.Checkpointer(root, rank=0, world=1) as ck:
        w = ldcp.Writer(checkpointer=ck)
        dcp.save(sd, storage_writer=w, checkpoint_id=2)
        w.close()
        assert not ck.closed
        assert [s.step for s in ck.steps(meta=False)] == [2]
        _, _, sd2 = load_into_fresh(root, ldcp.Reader(checkpointer=ck))
        assert_same(sd2["extra"], sd["extra"])
        assert not ck.closed


# ------------------------------------------------------------------ gloo jobs


from launch import launch as _launch  # noqa: E402


def launch(world, mode, root, step):
    _launch(world, "dcp_worker.py", mode, root, step)


@pytest.mark.parametrize("save_world,load_worlds", [(2, (4, 1)), (4, (2, 3))])
def test_dtensor_shards_load_with_another_world(root, save_world, load_worlds):
    launch(save_world, "save", root, 7)
    assert committed(root) == [7]
    for w in load_worlds:
        launch(w, "load", root, 7)


def test_a_rank_failing_in_write_data_fails_every_rank(root):
    launch(2, "fail", root, 3)
    assert committed(root) == [3]
