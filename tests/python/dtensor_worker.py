"""One rank of a gloo job with DTensor and FSDP2 state (torch >= 2.4), launched as
torchrun would launch it.

    dtensor_worker.py save ROOT REF   DTensors of several placements on 1-D (and, with
                                      4 ranks, 2-D) meshes and an FSDP2 model trained two
                                      steps with AdamW, saved by libckpt.torch; rank 0
                                      writes the full values to REF
    dtensor_worker.py load ROOT REF   the same names loaded into other placements on
                                      this world size, and into a fresh FSDP2 model and
                                      optimizer: full values equal REF, and one more
                                      training step agrees with REF's next step
"""
import sys

import torch
import torch.distributed as dist

try:
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
except ImportError:  # torch 2.4
    from torch.distributed._tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.device_mesh import init_device_mesh

import libckpt.torch as lt


def fsdp_model(mesh):
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(12, 40), torch.nn.ReLU(),
                            torch.nn.Linear(40, 6))
    for layer in (m[0], m[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    o = torch.optim.AdamW(m.parameters(), lr=1e-2)
    return m, o


def train(m, o, n):
    losses = []
    for i in range(n):
        torch.manual_seed(1000 + i)
        x = torch.randn(5, 12)
        loss = m(x).pow(2).mean()
        o.zero_grad()
        loss.backward()
        o.step()
        losses.append(loss.item())
    return losses


def full(v):
    return v.full_tensor() if isinstance(v, DTensor) else v


def main():
    mode, root, ref = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    ck = lt.open(root)
    torch.manual_seed(7)
    values = {"a": torch.randn(13, 7), "b": torch.randn(5, 11).to(torch.bfloat16),
              "c": torch.arange(24, dtype=torch.int64).reshape(4, 6)}
    if mode == "save":
        parts = {"a": distribute_tensor(values["a"], mesh, [Shard(0)]),   # uneven rows
                 "b": distribute_tensor(values["b"], mesh, [Shard(1)]),
                 "c": distribute_tensor(values["c"], mesh, [Replicate()])}
        if world == 4:
            mesh2 = init_device_mesh("cpu", (2, 2))
            parts["d"] = distribute_tensor(values["a"], mesh2, [Shard(0), Shard(1)])
            parts["e"] = distribute_tensor(values["a"], mesh2, [Replicate(), Shard(0)])
        m, o = fsdp_model(mesh)
        train(m, o, 2)
        state = {"extra": parts, "model": m, "optim": o}
        lt.save(ck, 5, state).wait()
        msd = {k: full(v) for k, v in m.state_dict().items()}   # as saved
        next_loss = train(m, o, 1)
        if rank == 0:
            torch.save({"values": values, "model": msd, "next": next_loss,
                        "names": sorted(parts)}, ref)
    else:
        refd = torch.load(ref)
        parts = {"a": distribute_tensor(torch.zeros(13, 7), mesh, [Shard(1)]),
                 "b": distribute_tensor(torch.zeros(5, 11, dtype=torch.bfloat16), mesh,
                                        [Replicate()]),
                 "c": distribute_tensor(torch.zeros(4, 6, dtype=torch.int64), mesh,
                                        [Shard(0)])}
        if "d" in refd["names"]:            # saved from 2-D meshes
            parts["d"] = distribute_tensor(torch.zeros(13, 7), mesh, [Shard(0)])
            parts["e"] = distribute_tensor(torch.zeros(13, 7), mesh, [Replicate()])
        m, o = fsdp_model(mesh)
        for p in m.parameters():
            torch.nn.init.zeros_(p)
        state = {"extra": parts, "model": m, "optim": o}
        lt.load(ck, state, 5, strict=True)
        for k in ("a", "b", "c"):
            assert torch.equal(full(parts[k]), refd["values"][k]), k
        for k in ("d", "e"):
            if k in parts:
                assert torch.equal(full(parts[k]), refd["values"]["a"]), k
        for k, v in m.state_dict().items():
            assert torch.equal(full(v), refd["model"][k]), k
        nxt = train(m, o, 1)
        assert abs(nxt[0] - refd["next"][0]) <= 1e-6 * max(1.0, abs(nxt[0])), (nxt,
                                                                              refd["next"])
    ck.close()
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}/{world} {mode} ok", flush=True)


if __name__ == "__main__":
    main()
