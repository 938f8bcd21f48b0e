"""Retention run by the job after each commit, and per-step metadata, from Python."""
import logging
import time

import pytest

np = pytest.importorskip("numpy")
import libckpt  # noqa: E402

if not libckpt._lib.has("ckpt_step_meta"):
    pytest.skip("this libckpt has no job retention or step metadata", allow_module_level=True)


def settled(ck, want, all=False):
    """The committed (or all) steps once the job's retention, which runs after the
    commit is reported, has caught up; fails after 20 s."""
    deadline = time.monotonic() + 20
    while True:
        got = {s.step: s.state for s in ck.steps(all=all)}
        if want(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def arr(v):
    return np.full((64, 64), v, dtype=np.float32)


def test_keep_last_never_touches_a_save_in_flight(tmp_path):
    with libckpt.Checkpointer(str(tmp_path / "r"), keep_last=1) as ck:
        ck.save(1, {"w": arr(1)}, wait=True)
        held = ck.begin(2)                 # begun, not submitted: in flight
        held.add("w", arr(2))
        ck.save(3, {"w": arr(3)}, wait=True)
        ck.save(4, {"w": arr(4)}, wait=True)
        listed = settled(ck, lambda g: 1 not in g and 3 not in g, all=True)
        assert 1 not in listed and 3 not in listed, listed
        assert listed.get(2) == "inflight", listed
        held.submit()
        held.wait()                        # the step in flight still commits whole
        # (then retention may retire it: it is neither the newest nor the latest)
        with ck.load(4) as ld:
            assert (ld.read("w") == 4).all()


def test_keep_every_and_latest(tmp_path):
    with libckpt.Checkpointer(str(tmp_path / "r"), keep_last=1, keep_every=4) as ck:
        for step in range(1, 10):
            ck.save(step, {"w": arr(step)}, wait=True)
        got = settled(ck, lambda g: sorted(g) == [4, 8, 9])
        assert sorted(got) == [4, 8, 9], got


def test_metadata_round_trip_and_errors(tmp_path):
    with libckpt.Checkpointer(str(tmp_path / "r")) as ck:
        meta = {"loss": 2.5, "tokens": 123456789012, "tag": "ünï", "nested": {"a": [1]}}
        ck.save(1, {"w": arr(1)}, meta=meta, wait=True)
        ck.save(2, {"w": arr(2)}, wait=True)
        assert ck.meta(1) == meta
        assert ck.meta(2) is None
        assert ck.steps()[0].meta == meta
        s = ck.begin(3)
        for bad in ("[1, 2]", "{not json", "7"):
            with pytest.raises(libckpt.CheckpointError) as e:
                s.set_meta(bad)
            assert e.value.code == -22, e.value
        with pytest.raises(libckpt.CheckpointOSError) as e:
            s.set_meta({"x": "y" * (1 << 17)})
        assert e.value.errno == 7          # E2BIG
        s.add("w", arr(3))
        s.submit()
        with pytest.raises(libckpt.StateError):
            s.set_meta({"late": True})
        s.wait()
        with pytest.raises(libckpt.NotFoundError):
            ck.meta(99)


def test_log_lines_reach_python(tmp_path):
    """The context's lines go to a logging.Logger or a callable, with job, rank and
    step; an exception in the callable never reaches the library's threads."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    logger = logging.getLogger("libckpt.test")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    h = Keep()
    logger.addHandler(h)
    try:
        with libckpt.Checkpointer(str(tmp_path / "a"), keep_last=1, log=logger,
                                  log_level="info", job_id="jobA") as ck:
            for step in (1, 2, 3):
                ck.save(step, {"w": arr(step)}, wait=True)
            settled(ck, lambda g: sorted(g) == [3])
        lines = [r for r in records if "retention after step" in r.getMessage()]
        assert lines, [r.getMessage() for r in records]
        assert all(r.levelno == logging.INFO and r.ckpt_rank == 0 and
                   r.ckpt_job == "jobA" for r in lines)
    finally:
        logger.removeHandler(h)

    got = []

    def boom(level, message, where):
        got.append((level, message, where))
        raise RuntimeError("a broken log callback")

    with libckpt.Checkpointer(str(tmp_path / "b"), keep_last=1, log=boom,
                              log_level="debug") as ck:
        for step in (1, 2):
            ck.save(step, {"w": arr(step)}, wait=True)
        with ck.load(2) as ld:
            assert (ld.read("w") == 2).all()
    assert got and all(lv in ("error", "warn", "info", "debug") for lv, _, _ in got)
    assert any(w["ckpt_step"] == 2 for _, _, w in got), got[:5]
    with pytest.raises(TypeError, match="log"):
        libckpt.Checkpointer(str(tmp_path / "c"), log="stderr")
