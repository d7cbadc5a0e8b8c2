"""The predictor costs a few rows in plain floats and many rows as numpy columns (speed: one
prediction asks for ~30 models with a row or two each).  Both ways must give the same answer."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from predictor import Predictor, TrainingJob, load_platform, predict, predict_many
from predictor.errors import PerfcastError
from predictor.estimate import _FLOAT_ROWS
from predictor.network import Links, collective_seconds, ring_seconds
from predictor.operators import OPERATORS, GpuSpec

GPU = GpuSpec("Test GPU", 80, {"fp16": 312.0, "bf16": 312.0, "fp32": 19.5}, 2039.0)


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_roofline_of_one_row_equals_the_column(name):
    op = OPERATORS[name]
    rng = np.random.default_rng(len(name))
    cols = {f: rng.integers(1, 1 << 16, size=50).astype(float) for f in op.features}
    for direction in op.directions:
        for precision in ("fp16", "fp32"):
            column = op.roofline_seconds(cols, direction, precision, GPU)
            rows = [op.roofline_seconds({f: float(cols[f][i]) for f in op.features}, direction, precision, GPU)
                    for i in range(50)]
            assert all(isinstance(r, float) for r in rows)
            np.testing.assert_allclose(rows, column, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_row_roofline_is_roofline_seconds_bit_for_bit(name):
    """Operator.row_roofline (a job's few rows) takes its constants once: the same bits as
    roofline_seconds, in every direction and precision, small shapes (the 1e-7 floor) and large."""
    op = OPERATORS[name]
    gpu = GpuSpec("Test GPU", 80, {"fp16": 312.0, "bf16": 312.0, "fp32": 19.5, "fp8": 624.0}, 2039.0)
    rng = np.random.default_rng(len(name) + 7)
    for direction in op.directions:
        for precision in ("fp16", "bf16", "fp32", "fp8"):
            row = op.row_roofline(direction, precision, gpu)
            for top in (4, 1 << 24):
                for values in rng.integers(1, top, size=(40, len(op.features))):
                    shape = {f: float(v) for f, v in zip(op.features, values)}
                    got, want = row(shape), op.roofline_seconds(shape, direction, precision, gpu)
                    assert type(got) is type(want) and got == want


def test_ring_model_one_collective_and_many():
    links = Links(intra_gbps=150.0, intra_latency_us=4.0, nic_gbps=22.0, nics_per_node=4,
                  inter_latency_us=9.0)
    size = 1e6 * 2.0
    # The ring's closed forms: intra-node all-reduce over 8 ranks; all-gather over 2 nodes × 8
    # (the ring uses min(GPUs, NICs) = 4 adapters); p2p between nodes (one adapter).
    assert ring_seconds(links, "allreduce", 1e6, 1, 8) == pytest.approx(
        2 * 7 / 8 * size / 150e9 + 14 * 4e-6, rel=1e-12)
    assert ring_seconds(links, "allgather", 1e6, 2, 8) == pytest.approx(
        15 * size / 88e9 + 15 * 9e-6, rel=1e-12)
    assert ring_seconds(links, "p2p", 1e6, 2, 8) == pytest.approx(size / 22e9 + 9e-6, rel=1e-12)
    assert ring_seconds(links, "allreduce", 1e6, 1, 1) == 0.0          # one rank: nothing to do
    with pytest.raises(ValueError, match="unknown collective"):
        ring_seconds(links, "broadcast", 1e6, 1, 1)
    # Many at once (what fitting scales its samples by) is the same model, broadcast.
    rng = np.random.default_rng(2)
    entries = rng.integers(1, 1 << 30, size=(6, 10)).astype(float)
    nodes = rng.integers(1, 9, size=(6, 10)).astype(float)
    got = collective_seconds(links, "reduce_scatter", entries, nodes, 4.0)
    assert got.shape == (6, 10)
    assert got[2, 3] == ring_seconds(links, "reduce_scatter", entries[2, 3], nodes[2, 3], 4.0)


def _jobs() -> list[TrainingJob]:
    base = TrainingJob.from_toml("examples/gpt20b-perlmutter.toml")
    jobs = []
    for mb, tp, pp, rec in itertools.product((1, 2, 4), (1, 2, 4), (1, 2, 4), ("none", "full", "selective")):
        try:
            jobs.append(base.replace(layout={"micro_batch": mb, "tp": tp, "pp": pp, "recompute": rec}))
        except PerfcastError:
            pass
    return jobs


@pytest.mark.parametrize("platform", ["perlmutter-a100", "vista-gh200", "dgx-h100"])
def test_many_jobs_at_once_equal_each_job_alone(platform):
    plat = load_platform(platform)
    jobs = _jobs()
    # Enough jobs that some model gets more rows than the float path takes: the column path runs.
    assert len(jobs) > _FLOAT_ROWS
    together = predict_many(jobs, plat)
    for job, p in zip(jobs, together):
        alone = predict(job, plat)              # a new Predictor: nothing remembered
        assert alone.iteration_seconds == pytest.approx(p.iteration_seconds, rel=1e-12)
        assert alone.interval_seconds == pytest.approx(p.interval_seconds, rel=1e-12)
        assert alone.warnings == p.warnings
        assert alone.extrapolated == p.extrapolated


def test_forgetting_answers_keeps_the_platform_s_own_work_and_changes_nothing():
    """Predictor.forget_answers() forgets every shape's answer but keeps what the platform's files
    alone decide (operator resolution, interval rule); the predictions are the same bits."""
    plat = load_platform("perlmutter-a100")
    job = _jobs()[0]
    held = Predictor(plat)
    first = held.predict(job)
    memo = held._platform_memo
    resolved, attention, rule = dict(memo.operators), dict(memo.attention_costs), held.interval_rule
    assert resolved and held._answers
    held.forget_answers()
    assert not held._answers and held.interval_rule is rule
    assert held._platform_memo is memo and memo.operators == resolved and memo.attention_costs == attention
    again = held.predict(job)
    assert again.to_dict() == first.to_dict()
    repeat = held.predict(job)                  # every answer from the memo this time
    assert repeat.to_dict() == first.to_dict()


def test_two_predictors_on_one_platform_share_nothing():
    plat = load_platform("perlmutter-a100")
    job = _jobs()[0]
    a, b = Predictor(plat), Predictor(plat)
    a.predict(job)
    assert a._answers and not b._answers
    assert b.predict(job).to_dict() == a.predict(job).to_dict()


@pytest.mark.parametrize("platform", ["perlmutter-a100", "vista-gh200", "dgx-h100"])
def test_operator_seconds_of_few_rows_in_floats_equal_the_columns_bit_for_bit(platform, monkeypatch):
    from predictor import estimate
    plat = load_platform(platform)
    checked = []

    def both(self, rows, ratios):
        floats = floats_path(self, rows, ratios)
        with monkeypatch.context() as m:
            m.setattr(estimate, "_FLOAT_ROWS", -1)       # the numpy columns, on the same rows
            columns = estimate.QuerySet._operator_seconds(self, rows)
        for a, b in zip(floats, columns):
            assert isinstance(a, list) and a == np.asarray(b).tolist()
            assert all(type(x) is type(y) for x, y in zip(a, np.asarray(b).tolist()))
        checked.append(len(rows.handles))
        return floats
    floats_path = estimate.QuerySet._operator_seconds_floats
    monkeypatch.setattr(estimate.QuerySet, "_operator_seconds_floats", both)
    reused = Predictor(plat)      # later jobs ask for a few shapes the earlier ones did not
    for job in _jobs():
        reused.predict(job)
    assert len(checked) > 5 and max(checked) <= _FLOAT_ROWS


@pytest.mark.parametrize("platform", ["perlmutter-a100", "dgx-h100"])
def test_one_job_s_answers_in_lists_equal_the_arrays_bit_for_bit(platform, monkeypatch):
    """QuerySet.evaluate fills one job's answers as plain lists and many jobs' as arrays: the same
    bits either way, on the shipped platform and with every [fitted] scale and [fabric] set (the
    scales and the fabric rewrite answers in place)."""
    import dataclasses

    from predictor import estimate
    from predictor.network import FabricSharing
    from predictor.platform import FittedTerms
    shipped = load_platform(platform)
    scaled = dataclasses.replace(shipped, fitted=FittedTerms(compute_scale=1.13, attention_scale=0.91,
                                                             network_scale=1.21, host_scale=1.05),
                                 fabric=FabricSharing(1.3))
    jobs = _jobs()[:40]
    for plat in (shipped, scaled):
        lists = [p.to_dict() for p in map(Predictor(plat).predict, jobs)]
        with monkeypatch.context() as m:
            m.setattr(estimate, "_LIST_HANDLES", -1)
            arrays = [p.to_dict() for p in map(Predictor(plat).predict, jobs)]
        assert lists == arrays


def test_collective_features_of_rows_equal_the_columns():
    from predictor.bundle import collective_features, collective_row_features
    rng = np.random.default_rng(5)
    rows = [(float(e), float(n), float(g)) for e, n, g in
            zip(rng.integers(0, 1 << 34, size=30), rng.integers(1, 65, size=30), rng.integers(1, 9, size=30))]
    rows.append((0.5, 1.0, 1.0))          # below one entry: read as one
    e, nodes, gpn = (np.array(c) for c in zip(*rows))
    want = collective_features(e, nodes, gpn)
    got = collective_row_features(rows)
    assert got.shape == want.shape == (31, 3) and got.tobytes() == want.tobytes()


def test_kept_model_rows_give_the_ratios_of_their_keys():
    """Bundle.model_rows (a Predictor keeps one per list of models it meets) answers as its keys
    do, bit for bit; one made by another bundle is read as the keys it holds."""
    from predictor.bundle import ModelRows
    plat = load_platform("perlmutter-a100")
    compute, colls = plat.compute, plat.collectives
    keys = sorted(k for k in compute.models if k.startswith(("linear", "layernorm")))[:9]
    rng = np.random.default_rng(11)
    X = rng.uniform(0.0, 16.0, size=(len(keys), 7))
    kept = compute.model_rows(keys)
    assert isinstance(kept, ModelRows) and list(kept) == keys
    assert compute.ratios_rows(kept, X).tobytes() == compute.ratios_rows(keys, X).tobytes()
    coll_keys = sorted(colls.models)[:3]
    coll_X = rng.uniform(0.0, 30.0, size=(3, 3))
    mixed_up = ModelRows(coll_keys)           # the collectives' keys with the compute forest's arrays
    mixed_up.forest, mixed_up.forest_rows = kept.forest, kept.forest_rows
    assert colls.ratios_rows(mixed_up, coll_X).tobytes() == colls.ratios_rows(coll_keys, coll_X).tobytes()
