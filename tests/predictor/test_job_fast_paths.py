"""TrainingJob.from_dict takes the values a launch reader gives (plain ints, bools, strings already
in their choices) without the general coercion, and the recipe is cached on what it depends on.
Both must give what the general path gives: the same job, the same errors."""
from __future__ import annotations

import math

import pytest

from predictor.errors import JobError
from predictor.interval import ALPHA, upper_at_level
from predictor.job import TrainingJob, _coerce, _KINDS
from predictor.recipe import groups, micro_batch_recipe, stage_layers, stage_parameter_counts, stage_parameters
from predictor.results import Breakdown
from statistics import NormalDist

JOB = {"model": {"layers": 8, "hidden": 2048, "heads": 16, "seq_len": 2048, "vocab": 50513,
                 "norm": "layernorm", "activation": "gelu", "attention": "flash", "pos_emb": "learned",
                 "parallel_residual": False, "tied_embeddings": True},
       "layout": {"pp": 2, "tp": 2, "dp": 4, "micro_batch": 4, "micro_batches": 16, "zero_stage": 0,
                  "recompute": "none"},
       "run": {"framework": "megatron", "precision": "fp16", "train_iters": 2000},
       "cluster": {"gpus_per_node": 4, "platform": "Any Name"}}


def _with(section: str, key: str, value):
    d = {s: dict(v) for s, v in JOB.items()}
    d[section][key] = value
    return d


def _outcome(d, source="job.toml"):
    try:
        return TrainingJob.from_dict(d, source=source).to_dict()
    except JobError as exc:
        return f"{exc.key} | {exc}"


@pytest.mark.parametrize("section", sorted(_KINDS))
def test_every_key_gets_what_the_general_coercion_gives(section):
    """Per key, a value of each type: the job built, or the error, is the one _coerce decides."""
    values = [0, 1, 7, -1, 1 << 45, 10 ** 30, 4.0, 4.5, math.nan, True, False, "", "none", " Flash ",
              "BF16", "megatron", "flash", [4, 4], None]
    for key, kind in _KINDS[section].items():
        for value in values:
            got = _outcome(_with(section, key, value))
            try:
                coerced = _coerce(f"{section}.{key}", key, kind, value, "job.toml")
            except JobError as exc:
                assert got == f"{exc.key} | {exc}", (key, value)
                continue
            # The job (or, where the value makes an impossible job, the error) of the coerced value.
            want = _outcome(_with(section, key, list(coerced) if isinstance(coerced, tuple) else coerced))
            assert got == want, (key, value)
            if isinstance(got, dict) and key in got[section] and kind in ("int", "bool", "str"):
                assert type(TrainingJob.from_dict(_with(section, key, value)).to_dict()[section][key]) is \
                    type(coerced), (key, value)


def test_strings_are_normalised_and_free_strings_kept():
    job = TrainingJob.from_dict(_with("model", "norm", " RMSNorm "))
    assert job.model.norm == "rmsnorm"
    assert job.cluster.platform == "Any Name"


def test_framework_and_kernel_rules_apply_as_before():
    # A Megatron-core framework and no split rule: Megatron's split, with or without [layout].
    d = {s: dict(v) for s, v in JOB.items() if s != "layout"}
    assert TrainingJob.from_dict(d).layout.pipe_split == "megatron"
    assert TrainingJob.from_dict(JOB).layout.pipe_split == "megatron"
    assert TrainingJob.from_dict(_with("layout", "pipe_split", "neox")).layout.pipe_split == "neox"
    # A kernel alone says the attention is fused; with an attention named, that one stays.
    d = _with("model", "attention_impl", "cudnn")
    del d["model"]["attention"]
    assert TrainingJob.from_dict(d).model.attention == "flash"
    d = _with("model", "attention_impl", "cudnn")
    d["model"]["attention"] = "unfused"
    with pytest.raises(JobError, match="model.attention_impl"):
        TrainingJob.from_dict(d)


def test_missing_model_and_unknown_keys_named():
    with pytest.raises(JobError, match=r"required key is missing \(the \[model\] section is absent\)"):
        TrainingJob.from_dict({"run": {"framework": "megatron"}})
    with pytest.raises(JobError, match=r"layout.tpp: unknown key \(did you mean 'tp' or 'pp'\?\)"):
        TrainingJob.from_dict(_with("layout", "tpp", 2))
    # Two keys about as near: both are offered, the nearer first, rather than one picked for the user.
    with pytest.raises(JobError, match=r"layout.micro_batchs: unknown key "
                                       r"\(did you mean 'micro_batches' or 'micro_batch'\?\)"):
        TrainingJob.from_dict(_with("layout", "micro_batchs", 2))
    # One clearly nearer than the next: that one alone.
    with pytest.raises(JobError, match=r"layout.zero_stag: unknown key \(did you mean 'zero_stage'\?\)"):
        TrainingJob.from_dict(_with("layout", "zero_stag", 2))


def test_to_dict_round_trips_with_lists():
    d = _with("layout", "stage_layers", [3, 5])
    d["layout"]["pipe_split"] = "neox"
    job = TrainingJob.from_dict(d)
    out = job.to_dict()
    assert out["layout"]["stage_layers"] == [3, 5] and isinstance(out["layout"]["stage_layers"], list)
    assert list(out) == ["model", "layout", "run", "cluster"]
    assert TrainingJob.from_dict(out) == job


def test_recipe_shared_only_where_it_cannot_differ():
    job = TrainingJob.from_dict(JOB)
    other = job.replace(layout={"pp": 4, "dp": 2, "zero_stage": 1, "recompute": "full"})
    assert micro_batch_recipe(job.model, job.layout) is micro_batch_recipe(other.model, other.layout)
    # Sequence parallelism changes the recipe only with tp > 1.
    sp = job.replace(layout={"sequence_parallel": True})
    assert micro_batch_recipe(sp.model, sp.layout) != micro_batch_recipe(job.model, job.layout)
    sp1 = job.replace(layout={"tp": 1, "sequence_parallel": True})
    tp1 = job.replace(layout={"tp": 1})
    assert micro_batch_recipe(sp1.model, sp1.layout) is micro_batch_recipe(tp1.model, tp1.layout)


@pytest.mark.parametrize("layout", [{"pp": 1}, {"pp": 2}, {"pp": 4, "virtual_stages": 2, "micro_batches": 8},
                                    {"pp": 2, "pipe_split": "neox"}])
def test_stage_parameter_counts_are_stage_parameters(layout):
    job = TrainingJob.from_dict(_with("run", "framework", "")).replace(layout=layout)
    m, lay = job.model, job.layout
    assert stage_parameter_counts(m, lay) == [stage_parameters(m, lay, r) for r in range(lay.pp)]
    assert len(stage_layers(m, lay)) == lay.pp and sum(stage_layers(m, lay)) == m.layers


def test_shared_groups_are_the_groups():
    job = TrainingJob.from_dict(JOB)
    g = groups(job, 4)
    assert (g["tp"].nodes, g["tp"].gpus_per_node) == (1, 2)
    assert (g["pp"].nodes, g["pp"].gpus_per_node) == (2, 1)       # 16 GPUs over nodes of 4
    assert (g["cp"].nodes, g["cp"].gpus_per_node) == (1, 1)


def test_upper_at_level_is_the_formula():
    for level in (0.5, 0.9, 0.99):
        for alpha in (ALPHA, 0.2):
            normal = NormalDist()
            want = 2.0 * (3.0 / 2.0) ** (normal.inv_cdf(level) / normal.inv_cdf(1.0 - alpha / 2.0))
            assert upper_at_level(2.0, 3.0, level, alpha) == want


def test_breakdown_to_dict_in_order():
    b = Breakdown(*[float(i) for i in range(6)], tp_allreduce_seconds=6)
    d = b.to_dict()
    assert list(d) == list(Breakdown.PARTS + Breakdown.INSIDE)
    assert d["tp_allreduce_seconds"] == 6.0 and type(d["tp_allreduce_seconds"]) is float


def test_first_missing_required_key_is_named_in_field_order():
    for missing, named in ((("seq_len", "heads"), "model.heads"), (("seq_len", "layers"), "model.layers"),
                           (("hidden", "seq_len"), "model.hidden")):
        d = {s: dict(v) for s, v in JOB.items()}
        for key in missing:
            del d["model"][key]
        with pytest.raises(JobError) as exc:
            TrainingJob.from_dict(d)
        assert exc.value.key == named and str(exc.value) == f"{named}: required key is missing"
