"""One rank of a torch.distributed (gloo) job, launched as torchrun would launch it
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment).

    dist_worker.py save ROOT STEP REF   train a DDP model a few steps, save it with
                                        libckpt.torch; rank 0 also writes the reference
                                        (torch.save) to REF
    dist_worker.py load ROOT STEP REF   load into a fresh model and optimizer, compare
                                        with REF, train one step, check every rank agrees
    dist_worker.py rankbound ROOT STEP  loading the rank-bound RNG part with another world
                                        size must raise RankBoundError
    dist_worker.py fail ROOT STEP       rank 1 saves a tensor the other ranks do not agree
                                        on: every rank's wait must raise, nothing visible
"""
import os
import sys

import torch
import torch.distributed as dist

import libckpt
import libckpt.torch as lt


def model_and_optim():
    torch.manual_seed(0)                 # the same initial weights on every rank
    m = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 8))
    o = torch.optim.AdamW(m.parameters(), lr=1e-2)
    return m, o


def main():
    mode, root, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ck = lt.open(root)
    assert (ck.rank, ck.world) == (rank, world)
    m, o = model_and_optim()
    if mode == "save":
        ddp = torch.nn.parallel.DistributedDataParallel(m)
        torch.manual_seed(100 + rank)    # each rank its own data and RNG position
        for _ in range(3):
            x = torch.randn(8, 16)
            loss = ddp(x).pow(2).mean()
            o.zero_grad()
            loss.backward()
            o.step()
        state = {"model": m, "optim": o, "rng": lt.RNGState(),
                 "extra": {"world": world, "note": "gloo"}}
        h = lt.save(ck, step, state)
        h.wait()
        # the ranks share the writing of the replicated tensors: each rank writes some
        st = h.stats()
        got = [None] * world
        dist.all_gather_object(got, st.logical_bytes)
        assert min(got) > 0, got
        if rank == 0:
            torch.save({"model": m.state_dict(), "optim": o.state_dict()}, sys.argv[4])
    elif mode == "load":
        ref = torch.load(sys.argv[4])
        m2, o2 = model_and_optim()
        for p in m2.parameters():
            torch.nn.init.zeros_(p)
        state = {"model": m2, "optim": o2, "extra": {}}
        assert lt.load(ck, state, step) == step
        for k, v in ref["model"].items():
            assert torch.equal(m2.state_dict()[k], v), k
        s2, sr = o2.state_dict(), ref["optim"]
        for pid, st in sr["state"].items():
            for k, v in st.items():
                assert torch.equal(s2["state"][pid][k], v), (pid, k)
        assert s2["param_groups"] == sr["param_groups"]
        assert state["extra"]["note"] == "gloo"
        with ck.load(step) as ld:       # each whole tensor was written by one rank only
            for it in ld.items():
                if it.name.startswith(("model/", "optim/")):
                    assert it.nshards == 1, (it.name, it.nshards)
        # the loaded state trains identically on every rank
        x = torch.ones(4, 16)
        loss = m2(x).pow(2).mean()
        o2.zero_grad()
        loss.backward()
        o2.step()
        w = m2[0].weight.detach().clone()
        ws = [torch.empty_like(w) for _ in range(world)]
        dist.all_gather(ws, w)
        assert all(torch.equal(w, x) for x in ws)
    elif mode == "rankbound":
        try:
            lt.load(ck, {"rng": lt.RNGState()}, step)
        except libckpt.RankBoundError as e:
            assert "rng" in str(e), str(e)
        else:
            raise AssertionError("loading rank-bound RNG state with another world size "
                                 "did not raise")
        # the explicit map: every new rank takes saved rank 0's generators
        lt.load(ck, {"rng": lt.RNGState()}, step, rank_bound=lambda r: 0)
    elif mode == "fail":
        t = torch.full((4,), float(rank == 1))     # replicas that differ
        h = lt.save(ck, step, {"extra": {"t": t}}, replicas="all")
        try:
            h.wait()
        except (libckpt.ValidationError, libckpt.AbortedError) as e:
            assert str(e), "no message"
        else:
            raise AssertionError("a save whose replicas differ committed")
        assert step not in [s.step for s in ck.steps()]
    ck.close()
    dist.barrier()
    print(f"rank {rank}/{world} {mode} ok", flush=True)
    # Leave without tearing the process group down. torch 1.13's gloo group can
    # deadlock in its destructor: DDP's reducer drops the last reference with the GIL
    # held and joins a gloo worker that is freeing a tensor and waits for the GIL. Every
    # rank has passed the barrier and libckpt is closed, so nothing is left to finish.
    os._exit(0)


if __name__ == "__main__":
    main()
