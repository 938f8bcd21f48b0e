"""st_check.py — the safetensors side of test_safetensors.sh, written from the format's
rules and Hugging Face's conventions, not from ckpt-reshard's code:

  validate DIR [MAX]     every file of an export against the format rules, and the
                         index against the files (MAX: --max-shard-size in bytes, to
                         check the split as huggingface_hub makes it); then, when the
                         safetensors library is importable, the same files loaded by it
  same DIR1 DIR2         two exports hold the same tensors, names, dtypes, bytes
  cast DIR1 DIR2 T       DIR2 is DIR1 with floating tensors cast to T (bf16, fp16),
                         rounded to nearest, ties to even, from the exact value
  hostile DIR            writes one bad input per case into DIR (listed on stdout)
"""
import json, math, os, struct, sys
import numpy as np

SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
         "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
FLOATS = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}


def no_dups(pairs):
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys {keys}"
    return dict(pairs)


def read(path):
    """(metadata, [(name, entry)] in header order, data bytes), checking every rule."""
    raw = open(path, "rb").read()
    assert len(raw) >= 8, path
    n = struct.unpack("<Q", raw[:8])[0]
    assert 8 + n <= len(raw), f"{path}: header length {n} past the file"
    assert n % 8 == 0, f"{path}: header of {n} bytes: the data is not 8-byte aligned"
    text = raw[8:8 + n].decode("utf-8")               # strict: UTF-8 or an exception
    body = text.rstrip(" ")
    assert body.endswith("}") and "\n" not in text[len(body):], f"{path}: padding is not spaces"
    pairs = json.loads(body, object_pairs_hook=lambda p: p)
    no_dups(pairs)
    meta = {}
    entries = []
    for k, v in pairs:
        if k == "__metadata__":
            meta = dict(v)
            assert all(isinstance(a, str) and isinstance(b, str) for a, b in v), f"{path}: metadata {v}"
            continue
        e = dict(v)
        assert set(e) == {"dtype", "shape", "data_offsets"}, (k, e)
        assert e["dtype"] in SIZES, (k, e)
        assert all(isinstance(s, int) and s >= 0 for s in e["shape"]), (k, e)
        entries.append((k, e))
    data = raw[8 + n:]
    at = 0
    for k, e in entries:                              # contiguous, in header order
        b, end = e["data_offsets"]
        assert b == at and end >= b, f"{path}: {k} offsets {b},{end} after {at}"
        assert end - b == math.prod(e["shape"]) * SIZES[e["dtype"]], (k, e)
        at = end
    assert at == len(data), f"{path}: {len(data) - at} bytes after the last tensor"
    assert meta.get("format") == "pt", meta           # what transformers asks for
    return meta, entries, data


def tensors(d):
    """{name: (dtype, shape, bytes)} of an export, with the index checked."""
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")),
                    object_pairs_hook=no_dups)
    wm = idx["weight_map"]
    out = {}
    for f in sorted(set(wm.values())):
        _, entries, data = read(os.path.join(d, f))
        for k, e in entries:
            assert wm.get(k) == f and k not in out, (k, f)
            b, end = e["data_offsets"]
            out[k] = (e["dtype"], e["shape"], data[b:end])
    assert set(out) == set(wm), set(wm) ^ set(out)
    assert idx["metadata"]["total_size"] == sum(len(v[2]) for v in out.values())
    return out, wm


def validate(d, limit=None):
    t, wm = tensors(d)
    files = sorted(set(wm.values()))
    names = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    assert sorted(names) == files, (names, files)
    if len(files) == 1:
        assert files == ["model.safetensors"], files
    else:
        assert files == [f"model-{i:05d}-of-{len(files):05d}.safetensors"
                         for i in range(1, len(files) + 1)], files
    if limit:
        # huggingface_hub's split, in the export's (sorted) order.
        shards, cur, size = [], [], 0
        for k in sorted(t):
            n = len(t[k][2])
            if n > limit:
                shards.append([k])
                continue
            if cur and size + n > limit:
                shards.append(cur)
                cur, size = [], 0
            cur.append(k)
            size += n
        shards.append(cur)
        got = [sorted(k for k in wm if wm[k] == f) for f in files]
        assert sorted(map(sorted, shards)) == sorted(got), "split differs from huggingface_hub's"
    for f in files:
        assert os.stat(os.path.join(d, f)).st_mode & 0o777 == 0o600
    try:
        from safetensors import safe_open
    except ImportError:
        print(f"{d}: {len(files)} file(s), {len(t)} tensors valid (own validator; the "
              "safetensors library is not importable here)")
        return
    import torch
    for f in files:
        with safe_open(os.path.join(d, f), framework="pt") as sf:
            for k in sf.keys():
                x = sf.get_tensor(k)
                raw = x.contiguous().view(torch.uint8).numpy().tobytes() if x.numel() else b""
                assert raw == t[k][2] and list(x.shape) == t[k][1], k
    # As transformers loads a sharded checkpoint: the index names the files, each file
    # is read whole with safetensors.torch.load_file, the union is the state dict.
    from safetensors.torch import load_file
    state = {}
    for f in sorted(set(wm.values())):
        part = load_file(os.path.join(d, f))
        assert not set(part) & set(state), f
        state.update(part)
    assert set(state) == set(wm), set(state) ^ set(wm)
    try:
        from transformers.modeling_utils import load_state_dict
        for f in files:
            assert set(load_state_dict(os.path.join(d, f))) == {k for k in wm if wm[k] == f}, f
        how = "transformers' load_state_dict"
    except ImportError:
        how = "transformers is not importable"
    print(f"{d}: {len(files)} file(s), {len(t)} tensors valid (own validator, the "
          f"safetensors library, the index loaded shard by shard; {how})")


def same(d1, d2):
    a, _ = tensors(d1)
    b, _ = tensors(d2)
    assert a == b, sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    print(f"{d1} and {d2}: the same {len(a)} tensors, bit for bit")


def f8(bits, ebits, mbits, fn):
    bias = (1 << (ebits - 1)) - 1
    e = (bits >> mbits) & ((1 << ebits) - 1)
    m = bits & ((1 << mbits) - 1)
    s = np.where(bits >> (ebits + mbits) & 1, -1.0, 1.0)
    v = np.where(e == 0, np.ldexp(m.astype(np.float64), 1 - bias - mbits),
                 np.ldexp((m | (1 << mbits)).astype(np.float64), e.astype(np.int64) - bias - mbits))
    top = (1 << ebits) - 1
    if fn:
        v = np.where((e == top) & (m == (1 << mbits) - 1), np.nan, v)
    else:
        v = np.where(e == top, np.where(m == 0, np.inf, np.nan), v)
    return s * v


def exact(dtype, raw):
    """The values as float64 (exact for every floating dtype)."""
    if dtype == "F64": return np.frombuffer(raw, "<f8").astype(np.float64)
    if dtype == "F32": return np.frombuffer(raw, "<f4").astype(np.float64)
    if dtype == "F16": return np.frombuffer(raw, "<f2").astype(np.float64)
    u = np.frombuffer(raw, np.uint8 if dtype.startswith("F8") else "<u2").astype(np.int64)
    if dtype == "BF16": return (u.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return f8(u, 4, 3, True) if dtype == "F8_E4M3" else f8(u, 5, 2, False)


def to_bf16(x):
    """Nearest bf16, ties to even, from float64: scale to the bf16 quantum, round
    with rint (ties to even), and the result is exact in float32."""
    with np.errstate(all="ignore"):
        fin = np.isfinite(x) & (x != 0)
        _, e = np.frexp(np.where(fin, x, 1.0))
        q = np.maximum(e - 8, -133)
        r = np.where(fin, np.ldexp(np.rint(np.ldexp(x, -q)), q), x)
        return (r.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def cast(d1, d2, target):
    a, _ = tensors(d1)
    b, _ = tensors(d2)
    assert set(a) == set(b)
    want_dt = {"bf16": "BF16", "fp16": "F16"}[target]
    nfloat = nties = 0
    for k, (dt, shape, raw) in a.items():
        dt2, shape2, raw2 = b[k]
        assert shape2 == shape, k
        if dt not in FLOATS:
            assert dt2 == dt and raw2 == raw, k
            continue
        nfloat += 1
        assert dt2 == want_dt, (k, dt2)
        x = exact(dt, raw)
        if target == "bf16":
            want = to_bf16(x)
            got = np.frombuffer(raw2, "<u2")
            # count the halfway cases the check went through
            with np.errstate(all="ignore"):
                nties += int(np.sum(np.isfinite(x) & (x.astype(np.float32).view(np.uint32) & 0xffff == 0x8000)))
        else:
            with np.errstate(all="ignore"):
                want = x.astype(np.float16).view(np.uint16)   # numpy rounds to nearest even
            got = np.frombuffer(raw2, "<u2")
        nan = np.isnan(x)
        wexp = (want >> (7 if target == "bf16" else 10)) & (0xff if target == "bf16" else 0x1f)
        gexp = (got >> (7 if target == "bf16" else 10)) & (0xff if target == "bf16" else 0x1f)
        top = 0xff if target == "bf16" else 0x1f
        assert np.all(gexp[nan] == top) and np.all((got[nan] & (0x7f if target == "bf16" else 0x3ff)) != 0), k
        bad = np.nonzero((want != got) & ~nan)[0]
        assert bad.size == 0, f"{k} ({dt}): element {bad[:5]}: {x[bad[:5]]} -> {got[bad[:5]]}, want {want[bad[:5]]}"
        del wexp, gexp
    assert nfloat > 3
    print(f"{nfloat} floating tensors cast to {target} as round-to-nearest-even wants "
          f"({nties} exact ties among them); the others unchanged")


def st_bytes(entries, data, meta=None, pad=True):
    h = {"__metadata__": meta or {"format": "pt"}}
    h.update(entries)
    s = json.dumps(h, ensure_ascii=False).encode()
    if pad:
        s += b" " * (-len(s) % 8)
    return struct.pack("<Q", len(s)) + s + data


def hostile(d):
    """One bad input per case: CASE PATH EXIT TEXT lines on stdout."""
    os.makedirs(d, exist_ok=True)
    good = {"a.w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
            "b.w": {"dtype": "I8", "shape": [4], "data_offsets": [16, 20]}}
    data = bytes(range(20))
    cases = []

    def put(case, blob, code, text):
        p = os.path.join(d, case + ".safetensors")
        open(p, "wb").write(blob)
        cases.append((case, p, code, text))

    put("good", st_bytes(good, data), 0, "imported")
    b = st_bytes(good, data)
    put("hlen_past_eof", struct.pack("<Q", len(b)) + b[8:], 9, "header length")
    put("hlen_huge", struct.pack("<Q", 1 << 40) + b[8:], 9, "header length")
    put("short", b"\x01\x00", 9, "shorter than")
    put("not_json", struct.pack("<Q", 8) + b"{nope:1}" + data, 9, "not valid JSON")
    dup = b'{"a.w":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},"a.w":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}}'
    put("dup_key", struct.pack("<Q", len(dup)) + dup + b"\0", 9, "duplicate")
    put("meta_not_str", st_bytes(good, data, {"format": "pt", "n": 3}), 9, "__metadata__")
    e = json.loads(json.dumps(good)); e["a.w"]["dtype"] = "F31"
    put("bad_dtype", st_bytes(e, data), 10, "a.w")
    e = json.loads(json.dumps(good)); e["a.w"]["shape"] = [3, 2]
    put("shape_mismatch", st_bytes(e, data), 10, "a.w")
    e = json.loads(json.dumps(good)); e["a.w"]["shape"] = [1 << 62, 1 << 62]
    put("shape_overflow", st_bytes(e, data), 10, "a.w")
    e = json.loads(json.dumps(good)); e["b.w"]["data_offsets"] = [12, 16]
    put("overlap", st_bytes(e, data[:16]), 11, "overlap")
    e = json.loads(json.dumps(good)); e["b.w"]["data_offsets"] = [20, 24]
    put("past_end", st_bytes(e, data), 11, "b.w")
    e = json.loads(json.dumps(good)); e["b.w"]["data_offsets"] = [17, 21]
    put("gap", st_bytes(e, data + b"\0"), 11, "gap")
    put("trailing", st_bytes(good, data + b"junk"), 11, "after the last")
    nu = st_bytes({"c.\u00e9": good["a.w"], "b.w": good["b.w"]}, data).replace("\u00e9".encode(), b"\xff\xfe")
    put("non_utf8_name", nu, 13, "\\xff")
    put("metadata_name", st_bytes({"x": good["a.w"], "y/../z": good["b.w"]}, data), 13, "y/../z")
    # directories with an index
    def model_dir(case, wm, code, text, files=None):
        p = os.path.join(d, case)
        os.makedirs(p, exist_ok=True)
        for f, blob in (files or {"model-00001-of-00001.safetensors": st_bytes(good, data)}).items():
            open(os.path.join(p, f), "wb").write(blob)
        open(os.path.join(p, "model.safetensors.index.json"), "w").write(
            json.dumps({"metadata": {"total_size": 20}, "weight_map": wm}))
        cases.append((case, p, code, text))
    f1 = "model-00001-of-00001.safetensors"
    model_dir("dir_good", {"a.w": f1, "b.w": f1}, 0, "imported")
    model_dir("dir_traversal", {"a.w": "../good.safetensors", "b.w": f1}, 12, "not a plain file name")
    model_dir("dir_absolute", {"a.w": "/etc/passwd", "b.w": f1}, 12, "not a plain file name")
    model_dir("dir_missing", {"a.w": f1, "b.w": "model-00002-of-00002.safetensors"}, 12, "model-00002")
    model_dir("dir_unlisted", {"a.w": f1}, 12, "b.w")
    model_dir("dir_absent_tensor", {"a.w": f1, "b.w": f1, "c.w": f1}, 12, "c.w")
    p = os.path.join(d, "dir_symlink")
    os.makedirs(p, exist_ok=True)
    os.symlink(os.path.join(d, "good.safetensors"), os.path.join(p, "m.safetensors"))
    open(os.path.join(p, "model.safetensors.index.json"), "w").write(
        json.dumps({"weight_map": {"a.w": "m.safetensors", "b.w": "m.safetensors"}}))
    cases.append(("dir_symlink", p, 12, "symbolic link"))
    model_dir("dir_bad_index", {"a.w": 7}, 12, "not a plain file name")
    for c in cases:
        print(*c, sep="\t")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "validate":
        validate(args[0], int(args[1]) if len(args) > 1 else None)
    elif cmd == "same":
        same(*args)
    elif cmd == "cast":
        cast(*args)
    elif cmd == "hostile":
        hostile(args[0])
