"""One rank of a test_dcp job on gloo (CPU), launched as torchrun launches it (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT): dcp.save and dcp.load through libckpt.dcp
with DTensor shards, and a save that one rank fails.

    dcp_worker.py save ROOT STEP     save the state of the seed (any world size)
    dcp_worker.py load ROOT STEP     load it into zeros, compare bit for bit
    dcp_worker.py fail ROOT STEP     rank 1 fails in write_data: every rank raises,
                                     nothing is committed; then the step saves
Prints "rank R/W MODE ok" when every check has passed."""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.device_mesh import init_device_mesh

try:
    from torch.distributed.tensor import DTensor, Shard
except ImportError:  # torch 2.4
    from torch.distributed._tensor import DTensor, Shard

import libckpt.dcp as ldcp

SEED = int(os.environ.get("CKPT_TEST_SEED", "1"))
SHAPES = {"model.w": ((10, 6), torch.float32), "model.b": ((7,), torch.bfloat16),
          "optim.state.w.exp_avg": ((11, 2, 3), torch.float32)}


def global_tensors(seed):
    g = torch.Generator().manual_seed(seed)
    out = {k: torch.randn(s, generator=g).to(dt) for k, (s, dt) in SHAPES.items()}
    out["model.emb"] = torch.randn(5, 3, generator=g)          # replicated: saved once
    out["model.count"] = torch.tensor(17 + seed, dtype=torch.int64)   # 0-d
    return out


def sharded(mesh, full, zeros=False):
    """DTensor Shard(0) of full on mesh, built from this rank's chunk (torch.chunk's
    split, as Shard(0) splits), so that no collective runs on bf16."""
    world, rank = mesh.size(), mesh.get_local_rank()
    chunks = torch.chunk(full, world, dim=0)
    assert len(chunks) == world, f"shape {tuple(full.shape)} does not split in {world}"
    local = chunks[rank].clone()
    if zeros:
        local.zero_()
    return DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                              shape=full.shape, stride=full.stride())


def state(mesh, seed, zeros=False):
    g = global_tensors(seed)
    nest = {"model": {}, "optim": {"state": {"w": {}}}}
    nest["model"]["w"] = sharded(mesh, g["model.w"], zeros)
    nest["model"]["b"] = sharded(mesh, g["model.b"], zeros)
    nest["optim"]["state"]["w"]["exp_avg"] = sharded(mesh, g["optim.state.w.exp_avg"], zeros)
    nest["model"]["emb"] = torch.zeros(5, 3) if zeros else g["model.emb"].clone()
    nest["model"]["count"] = (torch.zeros((), dtype=torch.int64) if zeros
                              else g["model.count"].clone())
    nest["extra"] = ({"epoch": 0, "tag": "", "raw": b""} if zeros else
                     {"epoch": 3 + seed, "tag": "dcp-\u00e9", "raw": bytes(range(256))})
    return nest


def check_equal(got, want, path=""):
    if isinstance(want, dict):
        assert set(got) == set(want), f"{path}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            check_equal(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, DTensor):
        a, b = got.to_local(), want.to_local()
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{a.shape}"
        assert torch.equal(a, b), f"{path}: the local shard differs"
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and torch.equal(got, want), f"{path} differs"
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


class FailOnRank1(DefaultSavePlanner):
    def resolve_data(self, write_item):
        if dist.get_rank() == 1:
            raise RuntimeError("injected failure in write_data")
        return super().resolve_data(write_item)


def committed(root):
    # A second, read-only view of the root: what any reader would see now.
    import libckpt
    with libckpt.Checkpointer(root, read_only=True, rank=0, world=1) as ck:
        return [s.step for s in ck.steps(meta=False)]


def main():
    mode, root, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    if mode == "save":
        with ldcp.Writer(root) as w:
            sd = state(mesh, SEED)
            dcp.save(sd, storage_writer=w, checkpoint_id=step)
            # dcp.save returned on this rank: the coordinator's finish saw the commit
            assert step in committed(root), f"step {step} not committed after dcp.save"
            dist.barrier()
    elif mode == "load":
        sd = state(mesh, SEED, zeros=True)
        with ldcp.Reader(root) as r:        # the latest step, agreed by rank 0
            dcp.load(sd, storage_reader=r)
        check_equal(sd, state(mesh, SEED))
        sd = state(mesh, SEED, zeros=True)
        with ldcp.Reader(root, step=step) as r:
            dcp.load(sd, storage_reader=r)
        check_equal(sd, state(mesh, SEED))
    elif mode == "fail":
        with ldcp.Writer(root) as w:
            try:
                dcp.save(state(mesh, SEED), storage_writer=w, checkpoint_id=step,
                         planner=FailOnRank1())
            except CheckpointException as e:
                assert 1 in e.failures, f"rank 1's failure missing: {e}"
                assert "injected failure" in str(e.failures[1][0]), e.failures
            else:
                raise AssertionError("dcp.save returned although rank 1 failed")
            dist.barrier()
            assert step not in committed(root), f"failed step {step} is visible"
            dist.barrier()
            # the same step saves once the failed attempt is over
            dcp.save(state(mesh, SEED), storage_writer=w, checkpoint_id=step)
            assert step in committed(root), f"step {step} not committed on retry"
        sd = state(mesh, SEED, zeros=True)
        dcp.load(sd, storage_reader=ldcp.Reader(root))
        check_equal(sd, state(mesh, SEED))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    dist.barrier()
    print(f"rank {rank}/{world} {mode} ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
