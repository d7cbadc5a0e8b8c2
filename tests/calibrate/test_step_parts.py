"""calibrate/step_parts.py: a training step's parts timed on their own, on one and two gloo ranks.

Nothing here depends on how fast the machine is: which parts are timed, that they add up to no
more than the step, and that every rank reports.
"""
from __future__ import annotations

import math
import queue

import pytest

from predictor import TrainingJob

NEEDS_TORCH = "training the model needs torch (the calibrate extra)"


def _tiny(dp: int = 1) -> dict:
    return {"model": {"layers": 2, "hidden": 64, "heads": 2, "seq_len": 32, "vocab": 256,
                      "attention": "fused_softmax", "pos_emb": "rotary"},
            "layout": {"pp": 1, "tp": 1, "dp": dp, "micro_batch": 2, "micro_batches": 2, "zero_stage": 1},
            "run": {"precision": "fp32"}, "cluster": {"gpus_per_node": 2}}


def test_parts_worker_separates_waiting_from_the_collectives():
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    from calibrate.step_parts import PARTS, parts_worker

    q = queue.SimpleQueue()
    parts_worker(0, 1, 0, _tiny(1), 1, 2, 0, q, False)
    every, iso = q.get()
    assert iso is None and len(every) == 1 and len(every[0]) == 2
    for row in every[0]:
        assert set(PARTS) <= set(row)
        assert row["wait"] < 1e-3 and row["all_reduce"] < 1e-3    # one rank: nothing to wait for
        assert row["step"] >= row["forward"] + row["backward"] > 0


def test_parts_with_two_gloo_ranks_reports_every_rank():
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    from calibrate.step_parts import PARTS, measure_step_parts

    res = measure_step_parts(_tiny(2), threads=1, steps=2, warmup=1, isolated=False, timeout_s=300.0)
    assert res.isolated is None
    assert len(res.ranks) == 2 and all(len(rows) == 2 for rows in res.ranks)
    for rows in res.ranks:
        for r in rows:
            assert r["wait"] >= 0.0 and r["all_reduce"] > 0.0 and r["all_gather"] > 0.0
            parts = sum(r[k] for k in PARTS if k != "step")
            assert parts <= r["step"] * 1.001 + 1e-6


def test_isolated_sum_times_every_operator_of_the_recipe():
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    from calibrate.step_parts import isolated_sum
    from predictor.recipe import micro_batch_recipe

    job = _tiny(1)
    job["layout"]["recompute"] = "none"
    j = TrainingJob.from_dict(job)
    iso = isolated_sum(j, 1000)
    r = micro_batch_recipe(j.model, j.layout)
    assert set(iso.ops) == {c.name for c in r.layer + r.embedding + r.head}
    assert iso.forward_seconds == pytest.approx(sum(f for f, _ in iso.ops.values()))
    assert iso.backward_seconds == pytest.approx(sum(b for _, b in iso.ops.values()))
    assert all(math.isfinite(f) and f > 0 and math.isfinite(b) and b > 0 for f, b in iso.ops.values())
    assert iso.optimizer_seconds > 0


def test_measured_parts_come_with_the_isolated_sum_and_recomputation_in_the_backward():
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    from calibrate.step_parts import measure_step_parts

    res = measure_step_parts(_tiny(1), threads=1, steps=1, warmup=0)
    assert TrainingJob.from_dict(_tiny(1)).layout.recompute == "full"
    assert len(res.ranks) == 1 and len(res.ranks[0]) == 1
    # Full recomputation: each layer's forward runs again in the backward.
    assert res.isolated.backward_seconds > sum(b for _, b in res.isolated.ops.values())


def test_predicted_ops_cost_every_operator_of_the_recipe():
    from calibrate.step_parts import predicted_ops
    from predictor import load_platform
    from predictor.recipe import micro_batch_recipe

    j = TrainingJob.from_dict(_tiny(1))
    r = micro_batch_recipe(j.model, j.layout)
    got = predicted_ops(j, load_platform("perlmutter-a100"))
    assert set(got) == {c.name for c in r.layer + r.embedding + r.head}
    assert all(f > 0 and b > 0 for f, b in got.values())
    # Twice the layers: an operator of the layers only costs twice as much, one of the embedding
    # and head only the same.
    deeper = TrainingJob.from_dict({**_tiny(1), "model": {**_tiny(1)["model"], "layers": 4}})
    got4 = predicted_ops(deeper, load_platform("perlmutter-a100"))
    outside = {c.name for c in r.embedding + r.head}
    only_layer = {c.name for c in r.layer} - outside
    assert only_layer and outside - {c.name for c in r.layer}
    for name in only_layer:
        assert got4[name] == pytest.approx((2 * got[name][0], 2 * got[name][1]))
    for name in outside - {c.name for c in r.layer}:
        assert got4[name] == pytest.approx(got[name])
