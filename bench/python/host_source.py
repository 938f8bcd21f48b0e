#!/usr/bin/env python3
"""host_source.py — libckpt.torch saving the bench's state from host memory (pinned
and pageable copies of the GPU state) next to the same save from device memory, to
tell the library's host-source path from DCP's staging in the async figures of
bench_torch.py. Prints one line per run: source, snapshot and durable seconds."""
import os
import shutil
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch import build_state  # noqa: E402

import libckpt.torch as lt  # noqa: E402


def main():
    d = sys.argv[1]
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    model, master, optim = build_state(torch, layers, 4096, 8192)
    dev = {f"t{i}": p.detach() for i, p in enumerate(list(model.parameters())
                                                     + list(master.parameters()))}
    for i, s in optim.state.items():
        for k, v in s.items():
            if v.dim():
                dev[f"o{i}.{k}"] = v
    srcs = {"device": dev,
            "pinned": {k: v.to("cpu").pin_memory() for k, v in dev.items()},
            "pageable": {k: v.to("cpu") for k, v in dev.items()}}
    shutil.rmtree(d, ignore_errors=True)
    with lt.open(d, pool_bytes=8 << 30) as ck:
        step = 0
        for name, sd in srcs.items():
            for _ in range(2):
                step += 1
                torch.cuda.synchronize()
                t0 = time.monotonic()
                h = lt.save(ck, step, {"extra": sd})
                h.wait_snapshot()
                snap = time.monotonic() - t0
                h.wait()
                print(f"{name:9s} snapshot {snap:.3f} s durable {time.monotonic() - t0:.3f} s",
                      flush=True)
                h.close()
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
