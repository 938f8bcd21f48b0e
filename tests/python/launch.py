"""Launching a job of N Python processes on this machine as torchrun launches one:
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the
environment of each, no job secret (the job's ranks agree on one themselves)."""
import os
import random
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = int(os.environ.get("CKPT_TEST_SEED", "1"))


def free_port_pair():
    """A port P with P+1 free too (gloo's store on P, libckpt's coordinator on P+1)."""
    rnd = random.Random(SEED ^ os.getpid() ^ id(object()))
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


def launch(world, script, mode, *args, timeout=240):
    """Run tests/python/SCRIPT MODE ARGS... as ranks 0..world-1 and wait for all of
    them; each must exit 0 and print 'rank R/W MODE ok'."""
    port = free_port_pair()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        env.pop("CKPT_JOB_SECRET", None)
        env.pop("CKPT_JOB_SECRET_FILE", None)
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, script), mode, *map(str, args)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
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
        assert rc == 0, f"rank {r} of {world} ({mode}) exited {rc}:\n{out}"
        assert f"rank {r}/{world} {mode} ok" in out, out
