"""libckpt.torch in a multi-process job on gloo: 2 and 4 processes launched as
torchrun launches them, saving and loading with another world size."""
import os
import random
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = int(os.environ.get("CKPT_TEST_SEED", "1"))


def free_port_pair():
    """A port P with P+1 free too (gloo's store on P, libckpt's coordinator on P+1)."""
    rnd = random.Random(SEED ^ os.getpid())
    for _ in range(200):
        p = rnd.randrange(20000, 60000)
        socks = []
        try:
            for q in (p, p + 1):
                s = socket.socket()
                s.bind(("127.0.0.1", q))
                socks.append(s)
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port pair")


def launch(world, *args, timeout=240, script="dist_worker.py"):
    port = free_port_pair()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        env.pop("CKPT_JOB_SECRET", None)
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, script),
                                       *map(str, args)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append((p.returncode, out))
    for r, (rc, out) in enumerate(outs):
        assert rc == 0, f"rank {r} of {world} ({args[0]}) exited {rc}:\n{out}"
        assert f"rank {r}/{world} {args[0]} ok" in out, out


@pytest.mark.parametrize("save_world,load_worlds", [(2, (4, 1)), (4, (2,))])
def test_save_and_load_with_another_world(tmp_path, save_world, load_worlds):
    root, ref = tmp_path / "root", tmp_path / "ref.pt"
    launch(save_world, "save", root, 7, ref)
    for w in load_worlds:
        launch(w, "load", root, 7, ref)
    launch(load_worlds[0], "rankbound", root, 7)


def test_a_failed_save_is_invisible_on_every_rank(tmp_path):
    launch(2, "fail", tmp_path / "root", 3)
