"""perf-calibrate run: a store's completeness is whether every point of the plan is in it (QA
finding 2), and --part collectives with one rank is refused (QA finding 6).

``run --ops linear1`` into a complete store used to mark it incomplete for good (install then
refused its fit).  The measurements are stubbed (every point "measured" at once) and the runs use
one rank, so these tests take well under a second each and depend on no machine's speed.
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="perf-calibrate run needs torch (the calibrate extra)")

from calibrate import runner  # noqa: E402
from calibrate.cli import main  # noqa: E402
from calibrate.errors import CalibrationError  # noqa: E402
from calibrate.runner import RunOptions, run_calibration  # noqa: E402
from calibrate.store import read_meta  # noqa: E402
from predictor.operators import OPERATORS  # noqa: E402

from .conftest import one_line_error  # noqa: E402


@pytest.fixture
def measured(monkeypatch):
    """Every operator point measures 10 µs per direction, without running a kernel."""
    calls = []

    def fake(pt, device, warmup, repeats, device_only=False):
        calls.append(pt)
        return "ok", {d: 10.0 for d in OPERATORS[pt.op].directions}
    monkeypatch.setattr(runner, "measure_point", fake)
    return calls


def _run(out, **kw):
    return run_calibration(RunOptions(out=out, device="cpu", plan="tiny", ranks=1, threads=1, **kw))


def test_an_ops_run_into_a_complete_store_keeps_it_complete(tmp_path, measured):
    store = tmp_path / "s"
    assert _run(store).complete
    n = len(measured)
    res = _run(store, ops=("linear1",))
    assert len(measured) == n and res.measured_operators == 0     # nothing new to measure
    assert res.complete and not res.notes
    prog = read_meta(store)["progress"]
    assert prog["complete"] is True
    assert prog["complete_plans"] == ["tiny", "tiny (linear1 only)"]
    # Again: still complete (it used to say the store was not complete, for ever).
    assert _run(store, ops=("linear1",)).complete and read_meta(store)["progress"]["complete"] is True


def test_an_ops_run_alone_is_not_complete_until_the_whole_plan_is_in(tmp_path, measured):
    store = tmp_path / "s"
    res = _run(store, ops=("gelu",))
    assert res.part_complete and not res.complete
    assert read_meta(store)["progress"]["complete"] is False
    # The whole plan run into it completes the store, the "gelu only" run's label with it: the
    # message that sent the admin to rerun that run (which never helped) is gone.
    res = _run(store)
    assert res.complete and not res.notes
    meta = read_meta(store)
    assert meta["progress"]["complete"] is True
    assert meta["progress"]["complete_plans"] == ["tiny", "tiny (gelu only)"]


def test_a_store_an_ops_run_left_incomplete_is_completed_by_the_next_run(tmp_path, measured):
    # What the QA pass was left with: a complete store that an older perfcast's --ops run marked
    # incomplete ("tiny (linear1 only)" never complete).
    store = tmp_path / "s"
    _run(store)
    from calibrate.store import SampleStore, StoreIdentity
    from calibrate.env import METHOD_VERSION
    meta = read_meta(store)
    s = SampleStore.open(store, StoreIdentity("cpu", meta["gpu_name"], METHOD_VERSION),
                         {"plans": ["tiny (linear1 only)"]})
    s.mark_complete(False, "tiny (linear1 only)")
    assert read_meta(store)["progress"]["complete"] is False
    assert _run(store, ops=("linear1",)).complete
    assert read_meta(store)["progress"]["complete"] is True


def test_a_stopped_ops_run_is_not_complete(tmp_path, measured):
    # Genuinely incomplete: the run stopped before its own points were all in.
    res = _run(tmp_path / "s", ops=("linear1",), stop_after=1)
    assert not res.complete and not res.part_complete
    assert read_meta(tmp_path / "s")["progress"]["complete"] is False


def test_collectives_with_one_rank_are_refused_before_any_work(tmp_path, measured, capsys):
    with pytest.raises(CalibrationError, match=r"--part collectives: collectives need 2 or more ranks"):
        _run(tmp_path / "s", part="collectives")
    assert not (tmp_path / "s").exists() and not measured
    assert main(["run", "--device", "cpu", "--plan", "tiny", "--ranks", "1", "--part", "collectives",
                 "--out", str(tmp_path / "t"), "--no-progress"]) == 2
    one_line_error(capsys, "--part collectives", "2 or more ranks", "--ranks")
    assert not (tmp_path / "t").exists()
