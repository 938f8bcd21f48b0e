#!/usr/bin/env python3
"""stage_report.py RESULTS_DIR — the table of bench/gpu/run-stage.sh from its phases'
JSON (raw.json, stage.json, bytegroup.json, zstd.json, dcp.json; any may hold an
error, and its rows then say n/a)."""
import json
import os
import sys


def load(d, name):
    try:
        with open(os.path.join(d, name)) as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip().startswith("{")]
        return json.loads(lines[-1]) if lines else {"error": f"{name}: no JSON"}
    except (OSError, ValueError) as e:
        return {"error": f"{name}: {e}"}


def main():
    d = sys.argv[1]
    raw, st, bg, zs, dc = (load(d, n) for n in
                           ("raw.json", "stage.json", "bytegroup.json", "zstd.json", "dcp.json"))
    # bytegroup1..N, each between raw writes bgraw{i-1} and bgraw{i}: its own limit is
    # the mean of those two, and the run of median ratio is the one reported.
    bg_runs = []
    i = 1
    while os.path.exists(os.path.join(d, f"bytegroup{i}.json")):
        o = load(d, f"bytegroup{i}.json")
        w = [load(d, f"bgraw{k}.json").get("write_Bps") for k in (i - 1, i)]
        w = [x for x in w if x]
        bg_runs.append((o, sum(w) / len(w) if w else None))
        i += 1
    B = st.get("bytes") or bg.get("bytes") or next((o.get("bytes") for o, _ in bg_runs), None)
    W = raw.get("write_Bps")
    d2d = st.get("d2d_s")
    best = dc.get("phases", {}).get("best", {})

    def s(v, nd=4):
        return "n/a" if v is None else f"{v:.{nd}f} s"

    def ms(v):
        return "n/a" if v is None else f"{v * 1e3:.3f} ms"

    def le(v, lim):
        return None if v is None else v <= lim

    def ok(c):
        return "n/a" if c is None else ("**yes**" if c else "**NO**")

    def tb(v):
        return "n/a" if v is None else f"{v / 1e12:.2f} TB/s"

    def g(o, *ks):
        for k in ks:
            o = (o or {}).get(k) if isinstance(o, dict) else None
        return o

    print("| measure | value | limit (same run) | ratio | target | met |")
    print("| --- | --- | --- | --- | --- | --- |")
    sm, pm = g(st, "staged", "modify_s"), g(st, "pinned", "modify_s")
    r = sm / d2d if sm and d2d else None
    print(f"| time until the caller may modify its tensors, device pool >= state | {ms(sm)} "
          f"| bytes / D2D = {ms(d2d)} | {r and f'{r:.2f}' or 'n/a'} | <= 1.2 | {ok(le(r, 1.2))} |")
    bs = g(best, "staged_s")
    print(f"| the same without the device pool (pinned path) | {ms(pm)} | — | "
          f"{pm and sm and f'{pm / sm:.0f}x later' or 'n/a'} | — | — |")
    print(f"| DCP's best (staging done) | {s(bs, 3)} | — | "
          f"{bs and sm and f'{bs / sm:.0f}x later than libckpt' or 'n/a'} | — | — |")
    stall = g(st, "staged", "stall_s")
    runs = st.get("staged_runs") or []
    every = ", ".join(ms(x.get("stall_s")) for x in runs)
    print(f"| host-visible stall with the event, device pool (median of {len(runs) or 1} saves"
          f"{': ' + every if every else ''}) | {ms(stall)} | — | — | <= 1 ms | "
          f"{ok(le(stall, 1e-3))} |")
    rg, hp = st.get("rss_growth"), st.get("host_pool_bytes")
    lim = hp + (64 << 20) if hp else None
    print(f"| host memory: peak RSS over the phases' contexts, above the RSS before them | "
          f"{rg is not None and f'{rg / 2**20:.0f} MiB' or 'n/a'} | host pool + 64 MiB = "
          f"{lim and f'{lim / 2**20:.0f} MiB' or 'n/a'} | — | <= pool + 64 MiB | "
          f"{ok(le(rg, lim) if lim else None)} |")
    du = st.get("device_use_of_pool")
    du = None if du is None or du < 0 else du
    dp = st.get("device_pool_bytes")
    print(f"| device memory the pool adds to a context's | {du is not None and f'{du / 2**20:.0f} MiB' or 'n/a'} "
          f"| device pool {dp and f'{dp / 2**20:.0f} MiB' or 'n/a'} | — | <= pool | "
          f"{ok(le(du, dp) if dp else None)} |")
    for name, label in (("incr", "with the device pool"), ("incr_host", "without it")):
        inc = st.get(name) or {}
        wf, dr = inc.get("written_fraction"), inc.get("durable_ratio")
        fd, sd = g(inc, "full", "durable_s"), g(inc, "step", "durable_s")
        un = g(inc, "step", "device_unchanged_bytes")
        print(f"| incremental, {100 * (inc.get('changed_bytes') or 0) / (B or 1):.1f}% changed, "
              f"{label}: bytes written | {wf is not None and f'{100 * wf:.1f}%' or 'n/a'} | — | — | "
              f"<= 12% | {ok(le(wf, 0.12))} |")
        uns = f" ({un / 2**20:.0f} MiB found unchanged on the device)" if un else ""
        print(f"| incremental, {label}: durable vs the full save | {s(sd)}{uns} | full {s(fd)} | "
              f"{dr and f'{dr:.3f}' or 'n/a'} | <= 0.15 | {ok(le(dr, 0.15))} |")
    # The targets are byte-grouped compression's; zstd alone is the comparison.
    bw = W
    runs_note = ""
    if bg_runs:
        rs = []
        for o, wr in bg_runs:
            dur = (o.get("compress") or {}).get("durable_s")
            rs.append((dur * wr / B if dur and wr and B else None, o, wr))
        ok_runs = sorted((x for x in rs if x[0] is not None), key=lambda x: x[0])
        if ok_runs:
            _, bg, bw = ok_runs[len(ok_runs) // 2]   # even count: the worse middle
        runs_note = ("; each run against the mean of the raw writes before and after it: " +
                     ", ".join("n/a" if r is None else f"{r:.2f}" for r, _, _ in rs) +
                     " (the median run shown; of an even number, the worse of the middle two)")
    for name, o, targeted in (("bytegroup:1", bg, True), ("zstd:1", zs, False)):
        c = o.get("compress") or {}
        dur, stored = c.get("durable_s"), c.get("stored_bytes")
        w = bw if targeted else W
        lim = B / w if B and w else None
        r = dur / lim if dur and lim else None
        rat = o.get("ratio") or {}
        t1, m1 = ("<= 0.9", ok(le(r, 0.9))) if targeted else ("— (comparison)", "—")
        print(f"| {name}, model-like state: durable save | {s(dur)} | bytes / raw write = "
              f"{s(lim)}{runs_note if targeted else ''} | {r and f'{r:.2f}' or 'n/a'} | {t1} | "
              f"{m1} |")
        bf = rat.get("bf16_weight")
        t2, m2 = (("bf16 weights >= 1.3", ok(None if not bf else bf >= 1.3)) if targeted
                  else ("— (comparison)", "—"))
        print(f"| {name}: ratio (raw / stored) | " +
              ", ".join(f"{k} {v:.2f}" for k, v in rat.items()) +
              f" | — | {stored and B and f'{B / stored:.2f} overall' or 'n/a'} | {t2} | {m2} |")
    print()
    print(f"Raw write {W and f'{W / 1e9:.2f} GB/s' or 'n/a'}; D2D {tb(st.get('d2d_Bps'))}; "
          f"state {B and f'{B / 2**30:.2f} GiB' or 'n/a'}; DCP best durable {s(g(best, 'durable_s'), 3)}.")
    errs = {k: v.get("error") for k, v in (("raw", raw), ("stage", st), ("bytegroup", bg),
                                            ("zstd", zs), ("dcp", dc)) if v.get("error")}
    for i, (o, _) in enumerate(bg_runs, 1):
        if o.get("error"):
            errs[f"bytegroup{i}"] = o["error"]
    for k, v in errs.items():
        print(f"- {k}: {v}")
    with open(os.path.join(d, "stage-bench.json"), "w") as f:
        json.dump({"raw": raw, "stage": st, "bytegroup": bg, "zstd": zs, "dcp": dc,
                   "bytegroup_runs": [{"run": o, "raw_write_Bps": w} for o, w in bg_runs]},
                  f, indent=1)


if __name__ == "__main__":
    main()
