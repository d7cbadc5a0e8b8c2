"""calibrate/collectives.py on a CPU: gloo ranks, repetition rules, and ranks that die.

Nothing here depends on how fast the machine is: counts, sizes, repetition rules and that the
measuring paths run.
"""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _needs_torch():
    # Each test skips on its own, with the reason, where torch is absent.
    pytest.importorskip("torch", reason="calibrate.collectives needs torch (the calibrate extra)")


def test_cpu_repeats_fill_the_budget_within_bounds():
    from calibrate.collectives import CPU_BUDGET_S, CPU_MAX_REPEATS, cpu_repeats

    assert cpu_repeats(1e-4, 8) == CPU_MAX_REPEATS                       # small: capped
    assert cpu_repeats(CPU_BUDGET_S / 20, 8) == 20                       # fills the budget
    assert cpu_repeats(0.5, 8) == 8                                      # large: the plan's count
    assert cpu_repeats(0.0, 8) == 8 and cpu_repeats(float("nan"), 8) == 8   # no warm-up timing
    assert cpu_repeats(1e-6, 100) == 100                                 # never fewer than asked


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
