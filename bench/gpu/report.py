#!/usr/bin/env python3
"""report.py RESULTS_DIR — the markdown table of run-h200.sh: libckpt on GPU state
against the limits measured in the same run (pinned D2H, raw O_DIRECT write/read)
and against torch DCP, with the targets of docs/perf.md. Reads d2h.json, raw.json,
ckpt.json and dcp.json (any may be missing or hold an error: its rows say so) and
prints the table, then writes RESULTS_DIR/gpu-bench.json with everything."""
import json
import os
import sys

MiB = 1 << 20


def load(d, name):
    p = os.path.join(d, name)
    try:
        with open(p) as f:
            lines = [l for l in f.read().splitlines() if l.startswith("{")]
        return json.loads(lines[-1]) if lines else {"error": f"{name}: no JSON output"}
    except (OSError, ValueError) as e:
        return {"error": f"{name}: {e}"}


def main():
    d = sys.argv[1]
    d2h, raw, ck, dc = (load(d, n) for n in ("d2h.json", "raw.json", "ckpt.json", "dcp.json"))
    B = ck.get("bytes") or dc.get("bytes")
    d2h_bw = d2h.get("pinned_registered_chunked_Bps")
    raw_w, raw_r = raw.get("write_Bps"), raw.get("read_Bps")
    ph = dc.get("phases", {})

    def s(v, unit="s", nd=3):
        return "n/a" if v is None else f"{v:.{nd}f} {unit}"

    def gbps(v):
        return "n/a" if v is None else f"{v / 1e9:.2f} GB/s"

    def dcp(phase, key):
        return ph.get(phase, {}).get(key)

    def verdict(ok):
        return "n/a" if ok is None else ("**yes**" if ok else "**NO**")

    rows = []

    def row(measure, value, limit, ratio, target_ok, dcp_txt):
        rows.append(f"| {measure} | {value} | {limit} | {ratio} | {verdict(target_ok)} | {dcp_txt} |")

    gib = f"{B / 2**30:.2f} GiB" if B else "? GiB"
    print(f"## libckpt GPU snapshot path vs torch DCP — {gib} of GPU state "
          f"({ck.get('tensors', dc.get('tensors', '?'))} tensors), {ck.get('device', dc.get('device', '?'))}")
    print()
    print(f"Limits measured in this run: pinned D2H {gbps(d2h_bw)} "
          f"(cudaHostAlloc, one copy: {gbps(d2h.get('pinned_hostalloc_whole_Bps'))}; pageable "
          f"{gbps(d2h.get('pageable_chunked_Bps'))}); raw O_DIRECT write {gbps(raw_w)}, read {gbps(raw_r)}. "
          f"Pool {ck.get('pool_bytes', 0) / 2**30:.1f} GiB (pinned at ckpt_open in {s(ck.get('open_s'))}). "
          f"torch {dc.get('torch', '?')}.")
    print()
    print("| measure | libckpt | limit (target) | ratio | target met | torch DCP (same run) |")
    print("| --- | --- | --- | --- | --- | --- |")

    # 1. durable save
    v = ck.get("save_durable_s")
    lim = B / raw_w if B and raw_w else None
    best_d = dcp("best", "durable_s")
    row("durable save (submit → durable + committed)", s(v),
        f"{s(lim)} = bytes ÷ raw write (≤ 1.1×)", f"{v / lim:.2f}×" if v and lim else "n/a",
        (v / lim <= 1.1) if v and lim else None,
        f"best async {s(best_d)}; save {s(dcp('save', 'durable_s'))}; save t8 "
        f"{s(dcp('save_t8', 'durable_s'))}; async default {s(dcp('async', 'durable_s'))}"
        + (f" — libckpt {best_d / v:.2f}× faster than DCP's best" if best_d and v else ""))
    # 2. time until the caller may modify its tensors
    v = ck.get("save_snapshot_s")
    lim = B / d2h_bw if B and d2h_bw else None
    best_s = dcp("best", "staged_s")
    row("time until the caller may modify its tensors (snapshot point, host waits)", s(v),
        f"{s(lim)} = bytes ÷ pinned D2H (≤ 1.2×)", f"{v / lim:.2f}×" if v and lim else "n/a",
        (v / lim <= 1.2) if v and lim else None,
        f"best async: staging done at {s(best_s)} (returned at {s(dcp('best', 'return_s'))}); "
        f"async default returns at {s(dcp('async', 'return_s'))}"
        + (f" — libckpt {best_s / v:.1f}× sooner" if best_s and v else ""))
    # 3. host-visible stall with the snapshot event
    v = ck.get("event_stall_s")
    row("host-visible stall with the snapshot event (begin → stream waits on it)",
        s(v * 1e3 if v is not None else None, "ms", 2), "10 ms", f"{v / 0.010:.2f}×" if v is not None else "n/a",
        (v <= 0.010) if v is not None else None,
        f"none (DCP's best frees the tensors at staging completion: {s(best_s)})")
    row("… the event completes (copies landed) / durable", f"{s(ck.get('event_complete_s'))} / "
        f"{s(ck.get('event_save_durable_s'))}", "", "", None, "")
    # 4. load to GPU
    v = ck.get("load_s")
    bw = B / v if B and v else None
    dl = dcp("load", "load_s")
    row(f"load to GPU ({ck.get('load_mode', '?')}, verified: {ck.get('verified', '?')})",
        f"{s(v)} ({gbps(bw)})", f"{gbps(raw_r)} raw read (≥ 0.9×)",
        f"{bw / raw_r:.2f}×" if bw and raw_r else "n/a", (bw / raw_r >= 0.9) if bw and raw_r else None,
        f"dcp.load {s(dl)} ({gbps(B / dl if B and dl else None)}, cache: "
        f"{dcp('load', 'cache')}, verified: {dcp('load', 'verified')})")
    # 5. RSS
    g, pool = ck.get("rss_growth"), ck.get("pool_bytes")
    lim = pool + 64 * MiB if pool else None
    row("peak host RSS growth over the RSS before ckpt_open", s(g / MiB if g is not None else None, "MiB", 0),
        f"pool + 64 MiB = {s(lim / MiB if lim else None, 'MiB', 0)}", f"{g / lim:.3f}×" if g is not None and lim else "n/a",
        (g <= lim) if g is not None and lim else None, "")
    print("\n".join(rows))
    errs = {k: v["error"] for k, v in (("d2h", d2h), ("raw", raw), ("libckpt", ck), ("dcp", dc))
            if isinstance(v, dict) and v.get("error")}
    errs.update({f"dcp.{k}": v.get("error") or v.get("skipped") for k, v in ph.items()
                 if v.get("error") or v.get("skipped")})
    if errs:
        print()
        print("Missing or failed: " + "; ".join(f"{k}: {v}" for k, v in errs.items()))
    if dcp("best", "first_run"):
        fr = dcp("best", "first_run")
        print()
        print(f"DCP best, first (cold stager) run: staged {s(fr.get('staged_s'))}, durable {s(fr.get('durable_s'))}.")
    gd = load(d, "ckpt_gds.json")
    if os.path.exists(os.path.join(d, "ckpt_gds.json")):
        print()
        print("GPUDirect Storage (`CKPT_GDS=1`: device loads and synchronous saves by cuFile, "
              "every chunk still hashed on the host), same run:")
        print()
        if gd.get("error"):
            print(f"- failed: {gd['error']}")
        else:
            act = "active" if gd.get("gds_active") else "NOT active (fell back to the pinned path)"
            print(f"| measure | pinned path | GPUDirect Storage ({act}) |")
            print("| --- | --- | --- |")
            print(f"| durable save (synchronous with GDS) | {s(ck.get('save_durable_s'))} | {s(gd.get('save_durable_s'))} |")
            print(f"| caller may modify its tensors | {s(ck.get('save_snapshot_s'))} | {s(gd.get('save_snapshot_s'))} |")
            print(f"| load to GPU | {s(ck.get('load_s'))} | {s(gd.get('load_s'))} |")
            print(f"| chunks by cuFile: written / read | — | {gd.get('gds_chunks_written')} / {gd.get('gds_chunks_read')} |")
            print(f"| verified bit-exact | {ck.get('verified')} | {gd.get('verified')} |")
    with open(os.path.join(d, "gpu-bench.json"), "w") as f:
        json.dump({"d2h": d2h, "raw": raw, "libckpt": ck, "libckpt_gds": gd, "dcp": dc}, f,
                  indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
