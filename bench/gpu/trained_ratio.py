#!/usr/bin/env python3
"""trained_ratio.py — compression ratios on the state of a model actually trained:
a small decoder-style transformer (token embedding, 6 blocks of self-attention and
MLP at width 768, ~60M parameters) trained for --steps steps of AdamW on a
synthetic next-token task on the GPU, with bf16 autocast. Its state is then saved
through libckpt with each codec, and the ratio (logical / stored bytes) is reported
per dtype and kind: fp32 weights, their bf16 copies (what a bf16 inference or
mixed-precision copy holds), AdamW's exp_avg and exp_avg_sq.

    trained_ratio.py --dir DIR [--steps 300] [--codecs bytegroup:1,bytegroup:3,zstd:1,zstd:3]

Prints one JSON object (last line). Needs torch with CUDA and libckpt's Python
binding (PYTHONPATH=python, LIBCKPT_LIBRARY=the built libckpt.so).
"""
import argparse
import json
import shutil
import time

import torch
import torch.nn as nn

import libckpt.torch as lt


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class LM(nn.Module):
    def __init__(self, vocab=8192, d=768, layers=6, heads=12, ctx=256):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(ctx, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=idx.device), 1)
        x = self.emb(idx) + self.pos[:t]
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


def batch(gen, n, t, vocab, dev):
    """Sequences with structure to learn: each token is a function of the previous
    two plus noise, so that the loss falls and the weights move."""
    x = torch.randint(0, vocab, (n, t + 1), generator=gen, device="cpu")
    for i in range(2, t + 1):
        x[:, i] = (x[:, i - 1] * 31 + x[:, i - 2] * 7 + torch.randint(0, 4, (n,), generator=gen)) % vocab
    return x[:, :-1].to(dev), x[:, 1:].to(dev)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--codecs", default="bytegroup:1,bytegroup:3,zstd:1,zstd:3")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run")
    ap.add_argument("--width", type=int, default=768)
    a = ap.parse_args()
    dev = a.device
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = LM(d=a.width, heads=max(1, a.width // 64)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    t0 = time.monotonic()
    losses = []
    for step in range(a.steps):
        x, y = batch(gen, 16, 256, 8192, dev)
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == a.steps - 1:
            losses.append((step, round(loss.item(), 4)))
    train_s = time.monotonic() - t0
    nparams = sum(p.numel() for p in model.parameters())
    state = {
        "model": model,
        "optim": opt,
        "extra": {"bf16": {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}},
    }

    def group(name):
        if name.startswith("extra"):
            return "bf16_weights"
        if "exp_avg_sq" in name:
            return "f32_exp_avg_sq"
        if "exp_avg" in name:
            return "f32_exp_avg"
        if name.startswith("optim"):
            return "optimizer_other"
        return "f32_weights"

    out = {"model": f"LM d={a.width} x 6 blocks", "params": nparams, "steps": a.steps,
           "train_s": round(train_s, 2), "loss": losses, "codecs": {}}
    for codec in a.codecs.split(","):
        root = f"{a.dir}/{codec.replace(':', '_')}"
        shutil.rmtree(root, ignore_errors=True)
        ck = lt.open(root, compress=codec, world=1, rank=0)
        h = lt.save(ck, 1, state)
        h.wait()
        groups = {}
        with ck.load(1) as ld:
            for it in ld.items():
                if it.is_blob or it.logical_bytes == 0:
                    continue
                g = groups.setdefault(group(it.name), [0, 0])
                g[0] += it.logical_bytes
                g[1] += it.stored_bytes
        ck.close()
        shutil.rmtree(root, ignore_errors=True)
        out["codecs"][codec] = {k: {"logical": v[0], "stored": v[1],
                                    "ratio": round(v[0] / v[1], 4) if v[1] else None}
                                for k, v in sorted(groups.items())}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
