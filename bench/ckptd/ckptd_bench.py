#!/usr/bin/env python3
"""ckptd_bench.py — the helpers of bench-ckptd.sh (the standard library only).

  ckptd_bench.py tcp W BYTES [--keep] [CMD ...]
      The network's limit on loopback: W sender processes stream BYTES in all (16 MiB
      messages, as a rank sends its chunks) to W receiving processes (a thread each
      in ckptd), timed from the moment all are connected until the last byte is in.
      Without --keep each sender sends one 16 MiB buffer again and again and each
      receiver receives into one: the CPUs' caches hold both. With --keep each sender
      sends its share from as many distinct bytes, in memory allocated as a rank's
      tensors are (anonymous, no madvise: huge pages only where the system's policy
      gives them to every large allocation, as ckpt-synth's malloc gets them), and
      each receiver keeps every byte it receives (in buffers mapped as lib/io maps
      ckptd's pool: huge pages asked for), all written before the clock starts: a
      rank's state leaving its memory and ckptd's pool holding it until its disk has
      written it. With CMD, that
      command starts at the same moment (the raw disk write: on a small machine both
      need the same CPUs) and its last line of output, a JSON object, is kept. One
      JSON object: bytes, seconds, Bps, keep, beside, cpu_busy (the share of the
      machine's CPU time busy meanwhile), sched (the processes' seconds on a CPU and
      runnable waiting for one, /proc/PID/schedstat; null without it).

  ckptd_bench.py watch METRICS_PORT SHARDS TIMEOUT_S [--threads]
      Polls ckptd's /metrics (every 10 ms) through one save: prints "ready" on stderr
      once it has the counters before the save, then one JSON object on stdout when
      SHARDS more shard files are durable: t_first (the first chunk: a pool buffer
      taken or bytes received), t_last (the last shard durable), seconds between
      them, bytes received and written meanwhile, the largest pool use seen, the
      share of the machine's CPU time that was busy between them (/proc/stat), and
      the number of polls. With --threads each poll also sums the scheduler's
      figures (/proc/PID/task/TID/schedstat) of the ranks' threads (every thread of
      a ckpt-rank process but its first, which made the state and waits for the
      save) and of ckptd's: the time they ran on a CPU and the time they were
      runnable but waiting for one. Where the second is large, the CPUs, not the
      network, paced the save, whatever share of them /proc/stat shows busy.

  ckptd_bench.py table RESULTS.json
      The table of bench-ckptd.sh from the figures the script gathered.
"""
import http.client
import json
import mmap
import os
import socket
import subprocess
import sys
import time

MSG = 16 << 20
POLL_S = 0.01


def buffer(n, fill, huge=True):
    """n bytes (a whole number of 64 KiB) of anonymous memory, huge pages asked for
    (huge) or left to the system's policy, every page written with fill (64 KiB)
    repeated."""
    m = mmap.mmap(-1, n)
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    v = memoryview(m)
    for off in range(0, n, len(fill)):
        v[off:off + len(fill)] = fill
    return v


def pin(var):
    """On the CPUs listed in environment variable var, if set (BENCH_SPLIT)."""
    cpus = os.environ.get(var)
    if cpus:
        os.sched_setaffinity(0, {int(x) for x in cpus.split(",")})


def tcp(world, total, keep, cmd):
    share = [total // world + (1 if r < total % world else 0) for r in range(world)]
    # Each process's bytes: one message's worth, or its whole share (in 64 KiB).
    span = [(-(-x // 65536) * 65536 if keep else MSG) or 65536 for x in share]
    lis = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lis.bind(("127.0.0.1", 0))
    lis.listen(world)
    port = lis.getsockname()[1]
    kids = []
    for r in range(world):
        pid = os.fork()
        if pid == 0:
            pin("BENCH_RANK_CPUS")
            lis.close()
            s = socket.create_connection(("127.0.0.1", port))
            buf = buffer(span[r], os.urandom(1 << 16), huge=not keep)
            go = s.recv(1)
            left, off = share[r] if go == b"g" else 0, 0
            while left:
                n = min(left, MSG, span[r] - off)
                s.sendall(buf[off:off + n])
                left -= n
                off = off + n if off + n < span[r] else 0
            s.shutdown(socket.SHUT_WR)
            s.recv(1)
            os._exit(0)
        kids.append(pid)
    conns = [lis.accept()[0] for _ in range(world)]
    lis.close()
    # A receiving process per connection: the kernel's loopback path is the figure,
    # not Python's lock between threads.
    rd, wr = os.pipe()
    receivers = []
    for i in range(world):
        pid = os.fork()
        if pid == 0:
            pin("BENCH_NODE_CPUS")
            os.close(rd)
            # conns[i] is the connection of sender i (accepted in order of connect,
            # which need not be i's: the span is the largest share's, to be sure).
            b, c, got, off = buffer(max(span), b"\1" * 65536), conns[i], 0, 0
            os.write(wr, b"r")
            while True:
                n = c.recv_into(b[off:off + min(MSG, len(b) - off)])
                if not n:
                    break
                got += n
                off = off + n if off + n < len(b) else 0
            c.sendall(b"x")
            os.write(wr, got.to_bytes(8, "little"))
            os._exit(0)
        receivers.append(pid)
    os.close(wr)
    ready = 0
    while ready < world:
        ready += len(os.read(rd, world - ready))
    beside = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) if cmd else None
    procs = kids + receivers
    t0, cpu0, sch0 = time.monotonic(), cpu_times(), schedstat(procs)
    for c in conns:
        c.sendall(b"g")
    got = [int.from_bytes(os.read(rd, 8), "little") for _ in range(world)]
    secs, cpu1, sch1 = time.monotonic() - t0, cpu_times(), schedstat(procs)
    out = beside.communicate()[0].strip().splitlines() if beside else []
    if beside and (beside.returncode or not out):
        sys.exit(f"tcp: {cmd[0]} failed (exit {beside.returncode})")
    os.close(rd)
    for c in conns:
        c.close()
    for pid in kids + receivers:
        os.waitpid(pid, 0)
    if sum(got) != total:
        sys.exit(f"tcp: {sum(got)} of {total} bytes arrived")
    print(json.dumps({"bytes": total, "world": world, "seconds": secs, "Bps": total / secs,
                      "keep": keep, "cpu_busy": (cpu1[0] - cpu0[0]) / max(1, cpu1[1] - cpu0[1]),
                      "sched": [(b - a) / 1e9 for a, b in zip(sch0, sch1)] if sch0 and sch1 else None,
                      "beside": json.loads(out[-1]) if out else None}))


def schedstat(pids):
    """ns on a CPU and ns runnable waiting for one, summed over single-threaded
    processes (alive or not yet reaped); None where the kernel keeps no such figures."""
    run = wait = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat") as f:
                r, w = map(int, f.read().split()[:2])
        except (OSError, ValueError):
            return None
        run, wait = run + r, wait + w
    return run, wait


def cpu_times():
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]   # idle and iowait
    return sum(v) - idle, sum(v)


class Metrics:
    """ckptd's /metrics over one kept-alive HTTP connection (a new one per poll would
    cost more CPU than the numbers are worth on a small machine)."""

    def __init__(self, port):
        self.port = port
        self.conn = None

    def get(self):
        for attempt in (0, 1):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                self.conn.request("GET", "/metrics")
                text = self.conn.getresponse().read().decode()
                break
            except (OSError, http.client.HTTPException):
                self.conn = None
                if attempt:
                    raise
        m = {}
        for line in text.splitlines():
            if line.startswith("ckptd_") and "{" not in line:
                k, v = line.split()
                m[k] = int(v)
        return m


class Threads:
    """The scheduler's time of the ranks' threads and ckptd's, summed (watch --threads):
    ns on a CPU and ns runnable waiting for one, from the first poll on (a thread
    that appears later counts from its start)."""

    def __init__(self):
        self.kind = {}     # pid -> "rank", "ckptd" or None
        self.last = {}     # (pid, tid) -> (run, wait) ns
        self.tot = {"rank": [0, 0], "ckptd": [0, 0]}
        self.poll()
        self.tot = {"rank": [0, 0], "ckptd": [0, 0]}

    def poll(self):
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            pid = int(d)
            if pid not in self.kind:
                try:
                    with open(f"/proc/{pid}/comm") as f:
                        c = f.read().strip()
                except OSError:
                    continue
                self.kind[pid] = ("rank" if c.startswith("ckpt-rank") else
                                  "ckptd" if c == "ckptd" else None)
            k = self.kind[pid]
            if k is None:
                continue
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for t in tids:
                if k == "rank" and t == d:
                    continue
                try:
                    with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                        run, wait = map(int, f.read().split()[:2])
                except (OSError, ValueError):
                    continue
                r0, w0 = self.last.get((pid, t), (0, 0))
                self.last[(pid, t)] = (run, wait)
                self.tot[k][0] += run - r0
                self.tot[k][1] += wait - w0
        return [*self.tot["rank"], *self.tot["ckptd"]]


def watch(port, shards, timeout, threads=False):
    src = Metrics(port)
    base = src.get()
    th = Threads() if threads else None
    print("ready", file=sys.stderr, flush=True)
    t_first = t_last = None
    pool_max = polls = 0
    # (seconds since the first chunk, busy, total jiffies[, the threads' ns: ranks on a
    # CPU, ranks waiting for one, ckptd on a CPU, ckptd waiting]) at each poll after it
    cpu = []
    m = base
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = src.get()
        now = time.monotonic()
        polls += 1
        pool_max = max(pool_max, m["ckptd_pool_used_bytes"])
        received = m["ckptd_bytes_received_total"] - base["ckptd_bytes_received_total"]
        if t_first is None and (m["ckptd_pool_used_bytes"] > 0 or received > 0):
            t_first, cpu_first = now, cpu_times()
        if t_first is not None:
            cpu.append((now - t_first, *cpu_times(), *(th.poll() if th else ())))
        elif th:
            th.poll()
        if m["ckptd_shards_written_total"] - base["ckptd_shards_written_total"] >= shards:
            t_last, cpu_last = now, cpu_times()
            break
        time.sleep(POLL_S)
    if t_first is None or t_last is None:
        sys.exit(f"watch: {m['ckptd_shards_written_total'] - base['ckptd_shards_written_total']}"
                 f" of {shards} shards durable after {timeout} s")
    d = lambda k: m[k] - base[k]
    print(json.dumps({"t_first": t_first, "t_last": t_last, "seconds": t_last - t_first,
                      "bytes_received": d("ckptd_bytes_received_total"),
                      "bytes_written": d("ckptd_bytes_written_total"),
                      "pool_used_max": pool_max, "polls": polls, "cpu": cpu,
                      "cpu_busy": (cpu_last[0] - cpu_first[0]) /
                                  max(1, cpu_last[1] - cpu_first[1])}))


def busy_until(watch, secs):
    """The CPUs' busy share from ckptd's first chunk to secs after it (the polls')."""
    cpu = watch.get("cpu") or []
    upto = [c for c in cpu if c[0] <= secs]
    if len(upto) < 2:
        return None
    return (upto[-1][1] - upto[0][1]) / max(1, upto[-1][2] - upto[0][2])


def threads_until(watch, secs):
    """The threads' seconds from ckptd's first chunk to secs after it: ranks on a CPU,
    ranks waiting for one, ckptd on a CPU, ckptd waiting (watch --threads)."""
    cpu = [c for c in watch.get("cpu") or [] if len(c) >= 7 and c[0] <= secs]
    if len(cpu) < 2:
        return None
    return [(cpu[-1][i] - cpu[0][i]) / 1e9 for i in range(3, 7)]


def table(path):
    with open(path) as f:
        r = json.load(f)
    G, MiB = 1e9, float(1 << 20)
    raw = r["raw_write_Bps"]
    raw_mean = sum(raw) / len(raw)
    net, net_busy = r["tcp"]["Bps"], r["tcp_beside_raw_write"]["Bps"]
    raw_beside = r["tcp_beside_raw_write"]["beside"]["write_Bps"]
    # TCP with the senders' bytes distinct, in memory allocated as the ranks' tensors
    # are, and the receivers keeping them as ckptd's pool does, where measured: the
    # network's limit for a save's bytes, which the target is on. The bare figure
    # (one buffer each side, which the CPUs' caches hold) is printed beside it.
    keep = r.get("tcp_keep_beside_raw_write")
    # Measured before the saves and again after them: the better of the two is the
    # bound. Loopback TCP on a shared host moves by a third between minutes (once
    # from 18 to 11 GB/s across one bench's saves), and a low figure must not flatter
    # the save; the higher is the stricter.
    keeps = [k for k in (keep, r.get("tcp_keep_after")) if k]
    keep_Bps = max(k["Bps"] for k in keeps) if keeps else None
    saves = r["saves"]
    best = max(saves, key=lambda s: s["watch"]["bytes_written"] / s["watch"]["seconds"])
    tp = best["watch"]["bytes_written"] / best["watch"]["seconds"]
    # The snapshot point: the slowest rank's stall, best of the runs, against the time
    # the network needs for what must leave the ranks before it (the state less what
    # their pools hold, at TCP's pace while ckptd's disk writes, as it does in a save)
    # and the time the disk needs for the state.
    snap = min(saves, key=lambda s: s["synth"]["stall_seconds"])
    size = snap["synth"]["bytes"]
    stall = snap["synth"]["stall_seconds"]
    must_leave = max(0, size - r["world"] * r["rank_pool"])
    net_t, disk_t = must_leave / net_busy, size / raw_mean
    kept_t = must_leave / keep_Bps if keep else None
    feed = min(raw_mean, net_busy)
    hwm, pool = r["ckptd_vmhwm_bytes"], r["ckptd_pool_bytes"]
    rss_lim = pool + 64 * MiB
    rows = []

    def row(measure, value, limit="", ratio="", target="", met=""):
        rows.append((measure, value, limit, ratio, target, met))

    yes = lambda ok: "PASS" if ok else "MISS"
    row("raw write of ckptd's data disk (bench_raw_io: O_DIRECT, with fdatasync), before / "
        "after the saves", " / ".join(f"{x / G:.2f}" for x in raw) + " GB/s")
    w = r["tcp"]["world"]
    rdma = r.get("transport") == "rdma"
    if rdma:
        row("lib/net over rdma, one message of the save's size (bench_rdma: the transport's "
            "RDMA WRITE ring, the DATA path's own limit): alone / while the disk takes a raw "
            f"write (which meanwhile ran at {raw_beside / G:.2f} GB/s)",
            f"{net / G:.2f} / {net_busy / G:.2f} GB/s")
    else:
        row(f"loopback TCP, {w} sender to {w} receiver processes: alone / "
            f"while the disk takes a raw write (which meanwhile ran at {raw_beside / G:.2f} GB/s)",
            f"{net / G:.2f} / {net_busy / G:.2f} GB/s")
        if keep:
            row("... each sender sending its share of distinct bytes from memory allocated as "
                "the ranks' tensors are, each receiver keeping every byte (as ckptd's pool "
                f"holds a save's), while the disk takes a raw write (at "
                f"{keep['beside']['write_Bps'] / G:.2f} GB/s), before / after the saves",
                " / ".join(f"{k['Bps'] / G:.2f}" for k in keeps) + " GB/s")
    if "bytes_received" in r:
        rx, rd = r["bytes_received"], r["bytes_received_rdma_write"]
        row("chunk bytes ckptd received by RDMA WRITE into granted buffers (the direct path) / "
            "in all", f"{rd / MiB:.0f} / {rx / MiB:.0f} MiB")
    # With the network held below the disk (BENCH_NET_RATE) ckptd can write no faster
    # than the network feeds it: its target is then on that, the disk's printed.
    held = bool(r.get("net_rate")) and net_busy < raw_mean
    row("ckptd write throughput: bytes written / (first chunk -> last DURABLE), best save",
        f"{tp / G:.2f} GB/s ({best['watch']['bytes_written'] / MiB:.0f} MiB in "
        f"{best['watch']['seconds']:.2f} s)",
        f"{raw_mean / G:.2f} GB/s raw write (mean)", f"{tp / raw_mean:.2f}",
        *(("(printed: the network is held below the disk)",) if held else
          (">= 0.90", yes(tp >= 0.9 * raw_mean))))
    row("... against what this machine can feed it: min(raw write, the network beside a raw "
        "write)",
        f"{tp / G:.2f} GB/s", f"{feed / G:.2f} GB/s", f"{tp / feed:.2f}",
        *((">= 0.90", yes(tp >= 0.9 * feed)) if held else ("(printed)",)))
    if keep:
        # The target is on a network narrower than the CPUs (BENCH_NET_RATE), as between
        # a job's nodes and ckptd's: bare loopback TCP is the CPUs' own copies, which a
        # save shares with the work each byte needs besides (its hash, the tail's copy
        # into the pool), so there the ratio says how the CPUs are shared and is printed.
        shaped = bool(r.get("net_rate"))
        row(f"snapshot point of the ranks (the slowest; rank pool {r['rank_pool'] >> 20} MiB), "
            "best save", f"{stall:.2f} s ({size / stall / G:.2f} GB/s)",
            f"{kept_t:.2f} s = (state - the ranks' pools) / TCP of distinct bytes, kept, "
            "beside a raw write (the better)", f"{kept_t / stall:.2f}",
            *((">= 0.90", yes(kept_t >= 0.9 * stall)) if shaped else
              ("(printed: bare loopback, the CPUs carry the network; the target is on a "
               "network narrower than them, BENCH_NET_RATE)",)))
        row("... against bare TCP (one buffer each side, in the CPUs' caches)", f"{stall:.2f} s",
            f"{net_t:.2f} s", f"{net_t / stall:.2f}", "(printed)")
    else:
        row(f"snapshot point of the ranks (the slowest; rank pool {r['rank_pool'] >> 20} MiB), "
            "best save", f"{stall:.2f} s ({size / stall / G:.2f} GB/s)",
            f"{net_t:.2f} s = (state - the ranks' pools) / "
            + ("the transport beside a raw write" if rdma else "TCP beside a raw write"),
            f"{net_t / stall:.2f}", ">= 0.90", yes(net_t >= 0.9 * stall))
    row("... against the disk: the snapshot point / (state / raw write); 1.00 where the "
        "disk paced the ranks, less as ckptd's pool takes the state ahead of it",
        f"{stall:.2f} s", f"{disk_t:.2f} s", f"{stall / disk_t:.2f}", "(printed)")
    row("ckptd peak RSS (VmHWM)", f"{hwm / MiB:.0f} MiB",
        f"pool {pool / MiB:.0f} MiB + 64 MiB", f"{hwm / rss_lim:.2f}", "<= 1.00",
        yes(hwm <= rss_lim))
    where = (f"over rdma at {r.get('addr')} (CKPT_RDMA_DIRECT={r.get('rdma_direct') or 'unset: 1'})"
             if rdma else "on loopback"
             + (f" held to {r['net_rate']} (tc tbf, in a network namespace of its own)"
                if r.get("net_rate") else ""))
    print(f"ckptd {where}: {r['world']} ranks, {size / (1 << 30):.2f} GiB per save, "
          f"{len(saves)} save(s), ckptd --pool {pool / MiB:.0f} MiB, chunks of "
          f"{r['chunk'] / MiB:.0f} MiB at most, {r['cpus']} CPUs"
          + (f"; ckptd and the raw writes in cgroup {r['cgroup']}" if r.get("cgroup") else "")
          + (f"; {r['split']} (the TCP limits' senders and receivers alike)"
             if r.get("split") else ""))
    print()
    print("| measure | value | limit (same run) | ratio | target | met |")
    print("| --- | --- | --- | --- | --- | --- |")
    for x in rows:
        print("| " + " | ".join(x) + " |")
    print()
    print("| save | ranks: begin -> committed | begin -> snapshot point | submit -> shard durable "
          "| ckptd: first chunk -> last DURABLE | ckptd GB/s | ckptd pool in use, most seen "
          "| CPUs busy meanwhile (all processes) | ... until the snapshot point |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for i, s in enumerate(saves, 1):
        w, y = s["watch"], s["synth"]
        b = busy_until(w, y["stall_seconds"])
        print(f"| {i} | {y['seconds']:.2f} s | {y['stall_seconds']:.2f} s | "
              f"{y['durable_seconds']:.2f} s | {w['seconds']:.2f} s | "
              f"{w['bytes_written'] / w['seconds'] / G:.2f} | {w['pool_used_max'] / MiB:.0f} MiB | "
              f"{100 * w['cpu_busy']:.0f} % | " + ("-" if b is None else f"{100 * b:.0f} %") + " |")
    th = [threads_until(s["watch"], s["synth"]["stall_seconds"]) for s in saves]
    if any(th):
        print()
        print("| save | from ckptd's first chunk to the snapshot point: the ranks' threads on a "
              "CPU / runnable, waiting for one | ckptd's threads on a CPU / waiting |")
        print("| --- | --- | --- |")
        for i, t in enumerate(th, 1):
            if t:
                print(f"| {i} | {t[0]:.2f} / {t[1]:.2f} CPU-s | {t[2]:.2f} / {t[3]:.2f} CPU-s |")
    nets = [(n, r.get(k)) for n, k in (("alone", "tcp"), ("beside a raw write", "tcp_beside_raw_write"),
                                       ("bytes kept", "tcp_keep_beside_raw_write"),
                                       ("bytes kept, after the saves", "tcp_keep_after"))]
    busy = ", ".join(f"{n} {100 * x['cpu_busy']:.0f} %" for n, x in nets if x and "cpu_busy" in x)
    if busy:
        print()
        print(f"CPUs busy during the TCP limits (all processes): {busy}.")
    sched = ", ".join(f"{n} {x['sched'][0]:.2f} / {x['sched'][1]:.2f} CPU-s in "
                      f"{x['seconds']:.2f} s" for n, x in nets if x and x.get("sched"))
    if sched and any(th):
        print(f"The TCP limits' processes on a CPU / runnable, waiting for one: {sched}.")


def main():
    a = sys.argv[1:]
    if len(a) >= 3 and a[0] == "tcp":
        keep = len(a) > 3 and a[3] == "--keep"
        tcp(int(a[1]), int(a[2]), keep, a[4 if keep else 3:])
    elif len(a) in (4, 5) and a[0] == "watch" and a[4:] in ([], ["--threads"]):
        watch(int(a[1]), int(a[2]), float(a[3]), threads=a[4:] == ["--threads"])
    elif len(a) == 2 and a[0] == "table":
        table(a[1])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
