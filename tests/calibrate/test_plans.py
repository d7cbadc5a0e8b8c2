from __future__ import annotations

import numpy as np
import pytest

from calibrate.errors import CalibrationError
from calibrate.plans import (GRIDS, PLANS, Allocation, ModelPoint, OperatorPoint, collective_groups,
                             estimate_cost, halton, make_plan, operator_shapes, _nominal_spec)
from predictor import fp8
from predictor.operators import CALIBRATED, COLLECTIVES, OPERATORS


def test_every_catalog_operator_has_shapes_with_its_features():
    p = ModelPoint(mp=2, b=2, heads=8, seq=128, hidden=512, vocab=1024)
    shapes = operator_shapes(p) | operator_shapes(p, gated=True)
    assert set(shapes) | {"optimizer"} == set(CALIBRATED)
    for op, shape in shapes.items():
        assert tuple(shape) == OPERATORS[op].features


def test_shapes_are_the_physical_per_gpu_shapes():
    p = ModelPoint(mp=2, b=2, heads=8, seq=128, hidden=512, vocab=1024)
    s = operator_shapes(p)
    tokens = 2 * 128
    assert s["linear1"] == {"m": tokens, "k": 512, "n": 3 * 512 // 2}
    assert s["linear2"] == {"m": tokens, "k": 256, "n": 512}
    assert s["linear4"] == {"m": tokens, "k": 4 * 512 // 2, "n": 512}
    assert s["baddbmm"] == {"batch": 2 * 4, "l": 128, "d": 64}
    assert s["flash_atten"] == {"b": 2, "heads": 4, "l": 128, "d": 64}
    assert s["cross_entropy"] == {"tokens": tokens, "vocab": 512}
    g = operator_shapes(p, gated=True)
    assert g["linear3"]["n"] == 2 * g["swiglu"]["width"]


@pytest.mark.parametrize("name", [p for p in PLANS if p != "adaptive"])
def test_builtin_plans_are_unique_and_cover_the_catalog(name):
    plan = make_plan(name, device="cpu", allocation=Allocation(1, 2))
    assert len(set(plan.operators)) == len(plan.operators)
    assert {p.op for p in plan.operators} == set(CALIBRATED)
    assert {c.kind for c in plan.collectives} == set(COLLECTIVES)
    cost = estimate_cost(plan, _nominal_spec("cpu"), "cpu")
    assert cost.wall_minutes > 0


def test_tiny_plan_has_enough_rows_to_fit_every_model():
    plan = make_plan("tiny", device="cpu", allocation=Allocation(1, 2))
    for op in CALIBRATED:
        assert sum(p.op == op for p in plan.operators) >= 8, op
    for kind in COLLECTIVES:
        assert sum(c.kind == kind for c in plan.collectives) >= 8, kind


def test_memory_filter_drops_shapes_that_do_not_fit():
    big = make_plan("paper", device="cuda", memory_gib=80)
    small = make_plan("paper", device="cuda", memory_gib=8)
    assert len(small.operators) < len(big.operators)


def test_adaptive_plan_states_its_budget_as_cost():
    with pytest.raises(CalibrationError, match="budget"):
        make_plan("adaptive", device="cuda")
    alloc = Allocation(2, 4)
    plan = make_plan("adaptive", device="cuda", allocation=alloc, budget_gpu_minutes=240)
    cost = estimate_cost(plan, _nominal_spec("cuda"), "cuda")
    assert cost.gpu_minutes == pytest.approx(240, rel=0.05)
    assert plan.candidates and not set(plan.candidates) & set(plan.operators)
    # space-filling: every operator gets points
    assert {p.op for p in plan.operators} == set(CALIBRATED)


def test_collective_groups_cover_intra_inter_and_mixed():
    assert collective_groups(Allocation(1, 1)) == []
    g = collective_groups(Allocation(4, 4))
    assert (1, 2) in g and (1, 4) in g          # TP-like, inside a node
    assert (2, 1) in g and (4, 1) in g          # across nodes
    assert (2, 4) in g and (4, 4) in g          # mixed


def test_halton_is_in_unit_interval_and_spreads():
    xs = [halton(i, 2) for i in range(1, 65)]
    assert all(0 <= x < 1 for x in xs)
    assert np.histogram(xs, bins=4, range=(0, 1))[0].tolist() == [16, 16, 16, 16]


def test_unknown_plan_and_precision_refused():
    with pytest.raises(CalibrationError, match="unknown plan"):
        make_plan("nope")
    with pytest.raises(CalibrationError, match="precisions"):
        make_plan("tiny", precisions=("fp4",))


def test_plan_file(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('format = 1\nname = "mine"\nrepeats = 3\n[grid]\nmp = [1]\nb = [1]\nhead_dim = [32]\n'
                 'seq = [32, 64]\nhidden = [64]\nvocab = [256]\noptimizer_layers = [1]\n'
                 'collective_entries = [1024]\n')
    plan = make_plan(str(f), device="cpu", allocation=Allocation(1, 2))
    assert plan.name == "mine" and plan.repeats == 3 and plan.operators


@pytest.mark.parametrize("text, message", [
    ("format = 1\n[grid\n", "not valid TOML"),
    ("format = 7\n[grid]\nmp = [1]\n", "plan format 7"),
    ("format = 1\n", r"needs a \[grid\]"),
    ("format = 1\n[grid]\nmp = [0]\n", "grid.mp"),
    ("format = 1\n[grid]\nbogus = [1]\n", "unknown"),
    ("format = 1\nrepeats = 0\n[grid]\nmp = [1]\n", "repeats"),
])
def test_corrupt_plan_file_refused(tmp_path, text, message):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(CalibrationError, match=message):
        make_plan(str(f), device="cpu")


def test_operator_point_shape_dict_round_trip():
    pt = OperatorPoint("rope", "fp32", (128, 4, 32))
    assert pt.shape_dict() == {"tokens": 128, "heads": 4, "d": 32}
    assert GRIDS["smoke"].model_points()


def test_a_plan_files_precisions_are_kept_unless_others_are_asked_for(tmp_path):
    from calibrate.plans import plan_precisions
    f = tmp_path / "p.toml"
    f.write_text('format = 1\nprecisions = ["bf16"]\n[grid]\nmp = [1]\n', encoding="utf-8")
    assert plan_precisions(str(f), "cuda") == ("bf16",)
    assert plan_precisions(str(f), "cuda", ("fp16",)) == ("fp16",)
    assert plan_precisions("smoke", "cuda") == ("fp16",)
    assert plan_precisions("smoke", "cpu") == ("fp32",)


def test_fp8_plan_measures_linears_and_no_collectives():
    plan = make_plan("tiny", device="cpu", precisions=("fp32", "fp8"))
    in_fp8 = {p.op for p in plan.operators if p.precision == "fp8"}
    assert in_fp8 == set(fp8.FP8_LINEARS)
    assert {p.op for p in plan.operators if p.precision == "fp32"} > in_fp8
    assert all(c.precision != "fp8" for c in plan.collectives)


def test_plan_costs_fp8_on_a_gpu_without_a_published_fp8_peak():
    plan = make_plan("tiny", device="cuda", precisions=("fp8",))
    assert estimate_cost(plan, _nominal_spec("cuda"), "cuda").wall_minutes > 0
