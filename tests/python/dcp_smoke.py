"""A quick check of libckpt.dcp in one process, on the GPU when there is one:

    python3 tests/python/dcp_smoke.py ROOT

dcp.save of a model and optimizer state (CUDA tensors when CUDA is available, plus
non-tensor values), dcp.async_save of the next step, then dcp.load of both into
zeros, compared bit for bit. Prints one line per stage and "dcp smoke ok"; exits 1
on a mismatch, 77 when this torch has no usable DCP storage API (< 2.4)."""
import os
import sys
import time


def main(root: str) -> int:
    try:
        import libckpt.dcp as ldcp
    except ImportError as e:
        print(f"skip: {e}")
        return 77
    import torch
    import torch.distributed.checkpoint as dcp

    import libckpt

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 256)).to(dev)
    if dev == "cuda":
        model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(torch.randn(8, 256, device=dev, dtype=next(model.parameters()).dtype)) \
            .float().square().mean().backward()
        opt.step()
        opt.zero_grad()

    def state(zero=False):
        sd = {"model": model.state_dict(), "optim": opt.state_dict(),
              "extra": {"epoch": 3, "note": "smoke", "raw": bytes(range(64))}}
        if zero:
            sd = {"model": {k: torch.zeros_like(v) for k, v in sd["model"].items()},
                  "optim": {"state": {k: {n: torch.zeros_like(t) for n, t in s.items()}
                                      for k, s in sd["optim"]["state"].items()},
                            "param_groups": sd["optim"]["param_groups"]},
                  "extra": {"epoch": 0, "note": "", "raw": b""}}
        return sd

    def same(a, b, path="state"):
        if isinstance(a, dict):
            return set(a) == set(b) and all(same(a[k], b[k], f"{path}.{k}") for k in a)
        if isinstance(a, torch.Tensor):
            ok = a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
            if not ok:
                print(f"MISMATCH {path}")
            return ok
        if a != b:
            print(f"MISMATCH {path}: {a!r} != {b!r}")
        return a == b

    print(f"torch {torch.__version__}, {dev}, libckpt {libckpt.library_version}")
    w = ldcp.Writer(root)
    t = time.perf_counter()
    dcp.save(state(), storage_writer=w, checkpoint_id=1)
    print(f"dcp.save step 1: {time.perf_counter() - t:.3f} s")
    saved = {k: v for k, v in state().items()}
    saved = {"model": {k: v.clone() for k, v in saved["model"].items()},
             "optim": {"state": {k: {n: x.clone() for n, x in s.items()}
                                 for k, s in saved["optim"]["state"].items()},
                       "param_groups": saved["optim"]["param_groups"]},
             "extra": saved["extra"]}
    t = time.perf_counter()
    fut = dcp.async_save(state(), storage_writer=w, checkpoint_id=2)
    print(f"dcp.async_save step 2 returned: {time.perf_counter() - t:.3f} s")
    getattr(fut, "upload_completion", fut).result()
    print(f"dcp.async_save step 2 committed: {time.perf_counter() - t:.3f} s")
    w.close()
    with libckpt.Checkpointer(root, read_only=True) as ck:
        steps = [s.step for s in ck.steps(meta=False)]
    print(f"committed steps: {steps}")
    ok = steps[-2:] == [1, 2]
    for step in (1, 2):
        sd = state(zero=True)
        t = time.perf_counter()
        dcp.load(sd, storage_reader=ldcp.Reader(root), checkpoint_id=step)
        print(f"dcp.load step {step}: {time.perf_counter() - t:.3f} s")
        ok = same(sd, saved) and ok
    print("dcp smoke ok" if ok else "dcp smoke FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(os.path.abspath(sys.argv[1])))
