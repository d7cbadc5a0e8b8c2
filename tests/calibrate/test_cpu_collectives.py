"""CPU data parallelism as the CPU family trains it and as the calibration times it.

Nothing here depends on how fast the machine is: counts, sizes, repetition rules and that the
measuring paths run.
"""
from __future__ import annotations

import math
import queue

import pytest

torch = pytest.importorskip("torch")

from predictor import TrainingJob  # noqa: E402

from .conftest import benchmark_module  # noqa: E402


def _bench():
    return benchmark_module("bench_cpu_family")


def _tiny(dp: int = 1) -> dict:
    return {"model": {"layers": 2, "hidden": 64, "heads": 2, "seq_len": 32, "vocab": 256,
                      "attention": "fused_softmax", "pos_emb": "rotary"},
            "layout": {"pp": 1, "tp": 1, "dp": dp, "micro_batch": 2, "micro_batches": 2, "zero_stage": 1},
            "run": {"precision": "fp32"}, "cluster": {"gpus_per_node": 2}}


def test_cpu_repeats_fill_the_budget_within_bounds():
    from calibrate.collectives import CPU_BUDGET_S, CPU_MAX_REPEATS, cpu_repeats

    assert cpu_repeats(1e-4, 8) == CPU_MAX_REPEATS                       # small: capped
    assert cpu_repeats(CPU_BUDGET_S / 20, 8) == 20                       # fills the budget
    assert cpu_repeats(0.5, 8) == 8                                      # large: the plan's count
    assert cpu_repeats(0.0, 8) == 8 and cpu_repeats(float("nan"), 8) == 8   # no warm-up timing
    assert cpu_repeats(1e-6, 100) == 100                                 # never fewer than asked


def test_training_reduces_exactly_what_the_predictor_costs():
    """Every family job: one all-reduce of the model's fp32 parameter count (the predictor's one
    bucket), and a ZeRO-1 all-gather of numel / dp; the trained model holds that many parameters."""
    from calibrate.gpt_model import model_class
    from predictor.estimate import REDUCE_BUCKET_ENTRIES
    from predictor.recipe import stage_parameter_counts

    b = _bench()
    for jd in b.family():
        j = TrainingJob.from_dict(jd)
        if j.model.hidden > 256:
            continue                              # same rule, bigger buffers: keep the test light
        (n,) = stage_parameter_counts(j.model, j.layout)
        assert n < REDUCE_BUCKET_ENTRIES          # one all-reduce call, as the model issues
        model = model_class(j)(j, "cpu", j.layout.dp)
        assert model.numel == n, b.name_of(jd)
        assert model.flat_grad.dtype == torch.float32 and model.padded % j.layout.dp == 0


def test_parts_worker_separates_waiting_from_the_collectives():
    b = _bench()
    q = queue.SimpleQueue()
    b._parts_worker(0, 1, 0, _tiny(1), 1, 2, 0, q, False)
    every, iso = q.get()
    assert iso is None and len(every) == 1 and len(every[0]) == 2
    for row in every[0]:
        assert {"forward", "backward", "wait", "all_reduce", "all_gather", "step"} <= set(row)
        assert row["wait"] < 1e-3 and row["all_reduce"] < 1e-3    # one rank: nothing to wait for
        assert row["step"] >= row["forward"] + row["backward"] > 0


def test_parts_with_two_gloo_ranks_reports_every_rank(tmp_path):
    import torch.multiprocessing as mp

    from calibrate.collectives import free_port, spawn_until_result

    b = _bench()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    spawn_until_result(b._parts_worker, (2, free_port(), _tiny(2), 1, 2, 1, q, False), 2, q, timeout_s=300.0)
    every, _ = q.get()
    assert len(every) == 2 and all(len(rows) == 2 for rows in every)
    for rows in every:
        for r in rows:
            assert r["wait"] >= 0.0 and r["all_reduce"] > 0.0 and r["all_gather"] > 0.0
            parts = sum(r[k] for k in ("zero_grad", "forward", "backward", "wait", "all_reduce",
                                       "optimizer", "all_gather"))
            assert parts <= r["step"] * 1.001 + 1e-6


def test_concurrent_slowdown_times_both_phases():
    b = _bench()
    r = b.concurrent_slowdown(_tiny(2), rounds=1, per_phase=2, threads=1, max_others=math.inf)
    assert len(r["alone"]) == 2 and len(r["concurrent"]) == 2 and r["dropped"] == 0
    assert r["alone_seconds"] == min(r["alone"]) and r["concurrent_seconds"] == min(r["concurrent"])
    assert math.isfinite(r["ratio"]) and r["ratio"] > 0


def test_collective_point_measures_on_two_gloo_ranks():
    from calibrate.collectives import spawn_local
    from calibrate.plans import CollectivePoint

    pts = [CollectivePoint(kind="allreduce", entries=1024, nodes=1, gpus_per_node=2, precision="fp32")]
    got = []
    n = spawn_local(2, "cpu", pts, warmup=1, repeats=2, threads=1, on_result=lambda p, us: got.append((p, us)))
    assert n == 1 and got[0][0] == pts[0] and 0 < got[0][1] < 1e6


# gloo can abort a rank in its teardown ("terminate called without an active exception") after
# the work is done; these tasks abort on purpose, after or before it.
def _abort_at_exit_task(ctx, emit, value):
    import atexit
    import os
    if emit is not None:
        emit(value)
    if ctx.rank == 1:
        atexit.register(os.abort)          # after the final barrier: what gloo's teardown does


def _abort_now_task(ctx, emit, value):
    import os
    if ctx.rank == 1:
        os.abort()                         # before the work is done: a real failure


def test_a_rank_dying_in_teardown_after_every_rank_finished_loses_nothing(caplog):
    from calibrate.collectives import spawn_ranks
    got = []
    assert spawn_ranks(2, "cpu", _abort_at_exit_task, (7,), on_result=got.append, timeout_s=120) == 1
    assert got == [7]
    assert "died in its teardown" in caplog.text


def test_a_rank_dying_before_it_finished_is_an_error():
    from calibrate.collectives import spawn_ranks
    from calibrate.errors import CalibrationError
    with pytest.raises(CalibrationError, match="a collective rank died"):
        spawn_ranks(2, "cpu", _abort_now_task, (7,), timeout_s=120)


def _result_then_abort_worker(rank, results, abort_first):
    import atexit
    import os
    import time
    if abort_first:
        if rank == 1:
            os.abort()             # before any result: the measurement is lost
        return
    if rank == 0:
        results.put("done")
    if rank == 1:
        # As after the final barrier of a real worker: rank 0 has put its result.
        while results.empty():
            time.sleep(0.01)
        atexit.register(os.abort)


def test_spawn_until_result_keeps_a_result_a_teardown_death_follows(caplog):
    import torch.multiprocessing as mp

    from calibrate.collectives import spawn_until_result
    from calibrate.errors import CalibrationError
    q = mp.get_context("spawn").SimpleQueue()
    spawn_until_result(_result_then_abort_worker, (q, False), 2, q, timeout_s=120, what="test rank")
    assert q.get() == "done" and "died after the measurement was complete" in caplog.text
    q = mp.get_context("spawn").SimpleQueue()
    with pytest.raises(CalibrationError, match="a test rank died"):
        spawn_until_result(_result_then_abort_worker, (q, True), 2, q, timeout_s=120, what="test rank")
