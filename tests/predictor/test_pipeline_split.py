"""The one pipeline split (predictor.recipe.pipeline_split): DeepSpeed's and Megatron's own
arithmetic, the explicit split, its validation, and that timing and memory see the same stages."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from predictor import JobError, TrainingJob, memory as mem, predict
from predictor.recipe import (partition_balanced, partition_uniform, pipeline_split, stage_layers,
                                 _neox_items)
from predictor.job import PIPE_SPLITS, Layout, ModelSpec

from .conftest import GPT20B, make_job


# ----------------------------------------------------------------------------- DeepSpeed oracle
def _deepspeed_partition_balanced(weights, num_parts):
    """DeepSpeed ≥ 0.13.1 ``deepspeed/runtime/utils.py::partition_balanced``, transcribed loop for
    loop (pure Python instead of numpy arrays): the oracle the vectorised version must match."""
    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    inf = math.inf
    dp_max = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_min = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_cost = [[inf] * (m + 1) for _ in range(n + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    prefix = [0.0] * (n + 1)
    for i, w in enumerate(weights):
        prefix[i + 1] = prefix[i] + w
    dp_max[0][0] = 0
    dp_cost[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                max_sum = max(dp_max[k][j - 1], prefix[i] - prefix[k])
                min_sum = min(dp_min[k][j - 1], prefix[i] - prefix[k])
                cost = max_sum - min_sum
                if dp_cost[i][j] >= cost:
                    dp_cost[i][j] = cost
                    dp_max[i][j] = max_sum
                    dp_min[i][j] = min_sum
                    position[i][j] = k
    parts = [n]
    for i in reversed(range(1, m + 1)):
        parts.append(position[parts[-1]][i])
    parts.reverse()
    return parts


def test_partition_uniform_spreads_the_remainder_over_the_first_parts():
    # DeepSpeed PR 4053's own example (38 items over 8 parts).
    assert partition_uniform(38, 8) == [0, 5, 10, 15, 20, 25, 30, 34, 38]
    assert partition_uniform(3, 5) == [0, 1, 2, 3, 3, 3]


def test_partition_balanced_minimises_the_spread():
    # DeepSpeed PR 4312's example: the old bisection gave [0, 2, 4, 5, 5] (an empty last part).
    assert partition_balanced([1, 1, 1, 1, 1], 4) == [0, 2, 3, 4, 5]
    assert partition_balanced([5, 1, 1, 1, 1, 1], 2) == [0, 1, 6]


@settings(max_examples=150, deadline=None, database=None)
@given(st.lists(st.integers(0, 10**9) | st.integers(0, 3), min_size=1, max_size=40),
       st.integers(1, 10))
def test_partition_balanced_is_deepspeeds_programme(weights, parts):
    assert partition_balanced(weights, parts) == _deepspeed_partition_balanced(weights, parts)


# ----------------------------------------------------------------------------- the rules
def _job(layers=44, pp=4, v=1, tp=1, model=None, **layout):
    m = dict(model or GPT20B, layers=layers)
    return make_job(model=m, pp=pp, tp=tp, dp=1, virtual_stages=v, micro_batches=pp * 2, **layout)


def test_neox_default_weighs_the_hooks_like_layers():
    # GPT-NeoX items: embedding, _pre_transformer_block, 44 layers, _post_transformer_block,
    # norm, head; type:transformer|mlp matches the layers and both hooks.
    weights = _neox_items(_job().model, 1, "neox")
    assert weights == [0, 1] + [1] * 44 + [1, 0, 0]
    assert stage_layers(_job()) == [11, 12, 11, 10]
    assert stage_layers(_job(pipe_split="neox")) == stage_layers(_job())     # the default


def test_deepspeed_parameters_counts_embedding_and_head():
    job = _job(tp=4, pipe_split="deepspeed_parameters")
    w = _neox_items(job.model, 4, "deepspeed_parameters")
    h = 6144
    emb = 12672 * h                                 # vocab rows per rank (Eq. 2) × hidden
    assert w[0] == emb and w[-1] == emb and w[1] == 0 and w[-3] == 0 and w[-2] == 2 * h
    assert stage_layers(job) == [11, 11, 11, 11]
    # A huge vocabulary weighs like several layers: the end stages hold fewer of them.
    big_vocab = _job(layers=16, tp=1, pipe_split="deepspeed_parameters",
                     model=dict(GPT20B, vocab=256_000, tied_embeddings=False))
    s = stage_layers(big_vocab)
    assert s[0] < s[1] and s[-1] < s[1] and sum(s) == 16


def test_deepspeed_uniform_is_the_papers_eq3_5():
    assert stage_layers(_job(pipe_split="deepspeed_uniform")) == [11, 12, 12, 9]
    assert stage_layers(_job(layers=40, pipe_split="deepspeed_uniform")) == [10, 11, 11, 8]


def test_megatron_even_split_and_its_refusal():
    assert stage_layers(_job(pipe_split="megatron")) == [11, 11, 11, 11]
    with pytest.raises(JobError) as e:
        _job(pp=8, pipe_split="megatron")
    assert e.value.key == "layout.pp" and "divisible" in str(e.value)


def test_megatron_first_and_last_stage():
    job = _job(pipe_split="megatron", first_stage_layers=8, last_stage_layers=10)
    assert stage_layers(job) == [8, 13, 13, 10]
    assert stage_layers(_job(pipe_split="megatron", first_stage_layers=5)) == [5, 13, 13, 13]
    assert stage_layers(_job(pp=2, pipe_split="megatron", first_stage_layers=20,
                             last_stage_layers=24)) == [20, 24]
    with pytest.raises(JobError) as e:           # 44 − 9 − 10 = 25 over 2 stages
        _job(pipe_split="megatron", first_stage_layers=9, last_stage_layers=10)
    assert e.value.key == "layout.first_stage_layers"
    with pytest.raises(JobError) as e:           # Megatron asserts against both kinds at once
        _job(pipe_split="megatron", first_stage_layers=8, last_stage_layers=10,
             account_for_loss=True)
    assert e.value.key == "layout.account_for_loss"


def test_megatron_embedding_and_loss_count_as_layers():
    # (46 + 2) / 4 = 12 per stage; the first and the last build one less.
    assert stage_layers(_job(layers=46, pipe_split="megatron", account_for_embedding=True,
                             account_for_loss=True)) == [11, 12, 12, 11]
    assert stage_layers(_job(layers=47, pipe_split="megatron", account_for_loss=True)) == [12, 12, 12, 11]
    with pytest.raises(JobError) as e:
        _job(layers=44, pipe_split="megatron", account_for_loss=True)      # 45 over 4
    assert e.value.key == "layout.pp"


def test_megatron_interleaved_options_apply_per_chunk():
    # pp = 2, v = 2, 46 + 2 = 48: 24 per device, 12 per chunk; chunk 0 (device 0) and the last
    # chunk (device 1's second) build one less.
    job = _job(layers=46, pp=2, v=2, pipe_split="megatron", account_for_embedding=True,
               account_for_loss=True)
    assert pipeline_split(job.model, job.layout) == (11, 12, 12, 11)
    assert stage_layers(job) == [23, 23]
    # 48 − 6 − 10 = 32 layers over the 2 middle stages: 16 each, 8 per chunk.
    job = _job(layers=48, pp=4, v=2, pipe_split="megatron", first_stage_layers=6, last_stage_layers=10)
    assert pipeline_split(job.model, job.layout) == (3, 8, 8, 5, 3, 8, 8, 5)
    assert stage_layers(job) == [6, 16, 16, 10]
    with pytest.raises(JobError) as e:                               # 7 layers over 2 chunks
        _job(layers=48, pp=4, v=2, pipe_split="megatron", first_stage_layers=7, last_stage_layers=9)
    assert e.value.key == "layout.first_stage_layers"


def test_interleaved_is_megatrons_even_split_for_every_rule():
    for rule in PIPE_SPLITS:
        job = _job(layers=48, pp=4, v=2, pipe_split=rule)
        assert pipeline_split(job.model, job.layout) == (6,) * 8
        assert stage_layers(job) == [12] * 4


def test_explicit_split_overrides_the_rule():
    job = _job(stage_layers=[10, 12, 12, 10])
    assert stage_layers(job) == [10, 12, 12, 10]
    # Interleaved: entry c is device c % pp's chunk c // pp.
    job = _job(layers=48, pp=2, v=2, stage_layers=[10, 14, 14, 10])
    assert stage_layers(job) == [24, 24]
    job = _job(layers=48, pp=2, v=2, stage_layers=[10, 10, 14, 14])
    assert stage_layers(job) == [24, 24]
    job = _job(layers=48, pp=2, v=2, stage_layers=[20, 10, 8, 10])
    assert stage_layers(job) == [28, 20]


@pytest.mark.parametrize("layout, key", [
    ({"stage_layers": [11, 11, 11]}, "layout.stage_layers"),             # wrong length
    ({"stage_layers": [11, 11, 11, 12]}, "layout.stage_layers"),         # sums to 45
    ({"stage_layers": [0, 14, 15, 15]}, "layout.stage_layers"),          # an empty stage
    ({"stage_layers": [-1, 15, 15, 15]}, "layout.stage_layers"),
    ({"stage_layers": [11.5, 11, 11, 10.5]}, "layout.stage_layers"),
    ({"stage_layers": [True, 15, 15, 13]}, "layout.stage_layers"),
    ({"stage_layers": "11,11,11,11"}, "layout.stage_layers"),
    ({"stage_layers": {"a": 1}}, "layout.stage_layers"),
    ({"stage_layers": [11, 11, 11, 11], "pipe_split": "megatron", "first_stage_layers": 11},
     "layout.stage_layers"),
    ({"pipe_split": "megatrn"}, "layout.pipe_split"),
    ({"pipe_split": 3}, "layout.pipe_split"),
    ({"first_stage_layers": 8}, "layout.first_stage_layers"),            # not megatron
    ({"account_for_loss": True}, "layout.account_for_loss"),
    ({"account_for_loss": "yes", "pipe_split": "megatron"}, "layout.account_for_loss"),
    ({"first_stage_layers": 10**6, "pipe_split": "megatron"}, "layout.first_stage_layers"),
    ({"pipe_split": "megatron", "first_stage_layers": 50}, "layout.first_stage_layers"),
])
def test_bad_split_keys_are_refused_by_name(layout, key):
    d = make_job().to_dict()
    d["layout"].update(layout)
    with pytest.raises(JobError) as e:
        TrainingJob.from_dict(d, source="job.toml")
    assert e.value.key == key
    assert key in str(e.value) and "job.toml" in str(e.value)


def test_new_keys_round_trip_through_to_dict_and_toml(tmp_path):
    job = _job(pipe_split="megatron", first_stage_layers=8, last_stage_layers=10)
    d = job.to_dict()
    for key in ("pipe_split", "stage_layers", "first_stage_layers", "last_stage_layers",
                "account_for_embedding", "account_for_loss"):
        assert key in d["layout"]
    assert d["layout"]["stage_layers"] == [] and d["layout"]["pipe_split"] == "megatron"
    assert TrainingJob.from_dict(d) == job
    explicit = _job(stage_layers=[10, 12, 12, 10])
    assert explicit.to_dict()["layout"]["stage_layers"] == [10, 12, 12, 10]
    p = tmp_path / "job.toml"
    p.write_text('[model]\nlayers = 44\nhidden = 6144\nheads = 64\nseq_len = 2048\n'
                 '[layout]\npp = 4\ntp = 4\ndp = 8\npipe_split = "Megatron"\n'
                 'stage_layers = [10, 12, 12, 10]\n')
    job = TrainingJob.from_toml(p)
    assert job.layout.stage_layers == (10, 12, 12, 10) and job.layout.pipe_split == "megatron"
    assert stage_layers(job) == [10, 12, 12, 10]


def test_perf_predict_json_job_shows_the_split(perlmutter):
    job = _job(stage_layers=[14, 10, 10, 10])
    d = predict(job, perlmutter).to_dict()
    assert d["job"]["layout"]["stage_layers"] == [14, 10, 10, 10]
    assert d["job"]["layout"]["pipe_split"] == "neox"


# ----------------------------------------------------------------------------- timing = memory
def test_timing_follows_the_split(perlmutter):
    job = _job(stage_layers=[20, 8, 8, 8], recompute="none")
    p = predict(job, perlmutter)
    assert list(p.details.stages.layers) == [20, 8, 8, 8]
    fwd = p.details.stages.forward_seconds
    assert fwd[0] == max(fwd) and fwd[0] > 2 * fwd[1]


def test_memory_finds_a_heavy_middle_stage():
    model = ModelSpec(layers=44, hidden=6144, heads=64, seq_len=2048)
    even = Layout(pp=4, tp=4, dp=8, micro_batch=4, micro_batches=16, recompute="selective",
                  pipe_split="megatron")
    heavy = Layout(**{**even.__dict__, "stage_layers": (2, 38, 2, 2)})
    assert mem.estimate(model, even).stage == 0
    est = mem.estimate(model, heavy)
    assert est.stage == 1
    assert est.total == max(mem._stage_estimate(model, heavy, "fp16", r, n).total
                            for r, n in enumerate([2, 38, 2, 2]))


_MODEL = st.fixed_dictionaries({
    "hidden": st.sampled_from([64, 128, 256]), "heads": st.sampled_from([1, 2, 4]),
    "seq_len": st.sampled_from([64, 128]), "vocab": st.integers(100, 70_000),
    "tied_embeddings": st.booleans(), "pos_emb": st.sampled_from(["rotary", "learned"]),
    "norm": st.sampled_from(["layernorm", "rmsnorm"]),
})


@st.composite
def split_jobs(draw):
    """Random valid jobs over every rule, option and interleaving."""
    model = draw(_MODEL)
    rule = draw(st.sampled_from(PIPE_SPLITS))
    pp = draw(st.integers(1, 12))
    v = draw(st.integers(2, 4)) if pp > 1 and draw(st.booleans()) else 1
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if model["heads"] % t == 0]))
    layout = {"pp": pp, "tp": tp, "dp": 1, "micro_batch": 1, "micro_batches": pp * draw(st.integers(1, 3)),
              "virtual_stages": v, "pipe_split": rule, "zero_stage": 1}
    kind = "plain"
    if rule == "megatron":
        kind = draw(st.sampled_from(["even", "first_last", "account"] if pp > 1 else ["even", "account"]))
    if kind == "first_last":
        first, last = draw(st.integers(0, 6)) * v, draw(st.integers(0, 6)) * v
        assume(first or last)
        mid = draw(st.integers(1, 6)) * v
        others = pp - (1 if first else 0) - (1 if last else 0)
        layers = first + last + others * mid
        assume(layers >= pp * v)
        layout.update(first_stage_layers=first, last_stage_layers=last)
    elif kind == "account":
        emb, loss = draw(st.booleans()), draw(st.booleans())
        per_chunk = draw(st.integers(3, 8))
        layers = pp * v * per_chunk - int(emb) - int(loss)
        layout.update(account_for_embedding=emb, account_for_loss=loss)
    elif kind == "even" or v > 1:
        layers = pp * v * draw(st.integers(1, 10))
    else:
        layers = draw(st.integers(pp, 120))
    if kind in ("plain", "even") and draw(st.integers(0, 3)) == 0:
        # An explicit split: a random composition of the layers into pp·v positive parts.
        cuts = sorted(draw(st.sets(st.integers(1, layers - 1), min_size=pp * v - 1,
                                   max_size=pp * v - 1))) if pp * v > 1 else []
        assume(len(cuts) == pp * v - 1)
        bounds = [0] + cuts + [layers]
        layout["stage_layers"] = [b - a for a, b in zip(bounds, bounds[1:])]
    job = TrainingJob.from_dict({"model": dict(model, layers=layers), "layout": layout})
    return job, kind


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(split_jobs())
def test_split_properties_on_random_valid_jobs(case):
    job, kind = case
    lay, L = job.layout, job.model.layers
    split = pipeline_split(job.model, lay)
    assert len(split) == lay.pp * lay.virtual_stages
    assert sum(split) == L and min(split) >= 0
    explicit = bool(lay.stage_layers)
    if explicit:
        assert list(split) == list(lay.stage_layers)
    # Every stage holds a layer, except where DeepSpeed itself leaves one empty: few layers per
    # stage (neox below 2·pp − 2 layers, uniform below 4·pp − 5), or an embedding that weighs as
    # much as a stage's share of the parameters.
    if explicit or lay.virtual_stages > 1 or lay.pipe_split == "megatron" \
            or (lay.pipe_split in ("neox", "deepspeed_uniform") and L >= 4 * lay.pp):
        assert min(split) >= 1
    # Timing's and memory's stages are the recipe's.
    per_device = stage_layers(job)
    assert len(per_device) == lay.pp and sum(per_device) == L
    assert mem.stage_layers(job.model, lay) == per_device
    assert [mem.stage_parameters(job.model, lay, r) - mem.stage_parameters(job.model, lay, r, 0)
            for r in range(lay.pp)] == pytest.approx(
        [n * mem.layer_parameters(job.model, lay.tp) for n in per_device])
    # The worst stage is the worst of all stages.
    worst = mem.estimate(job.model, lay, "fp16")
    assert worst.total == pytest.approx(max(mem._stage_estimate(job.model, lay, "fp16", r, n).total
                                            for r, n in enumerate(per_device)))


@settings(max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow,
                                 HealthCheck.function_scoped_fixture])
@given(split_jobs())
def test_timing_and_memory_see_the_same_stages(perlmutter, case):
    job, _ = case
    p = predict(job, perlmutter)
    assert list(p.details.stages.layers) == stage_layers(job) == mem.stage_layers(job.model, job.layout)
    assert len(p.details.stages.forward_seconds) == job.layout.pp
