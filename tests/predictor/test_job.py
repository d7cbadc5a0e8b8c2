import dataclasses

import pytest

from predictor import JobError, TrainingJob
from predictor.job import check_layout

from .conftest import GPT20B

BASE = {"model": {"layers": 8, "hidden": 1024, "heads": 16, "seq_len": 512},
        "layout": {"pp": 2, "tp": 2, "dp": 2}}


def with_(section, **kv):
    d = {k: dict(v) for k, v in BASE.items()}
    d.setdefault(section, {}).update(kv)
    return d


def test_defaults_filled_and_round_trip():
    job = TrainingJob.from_dict(BASE)
    d = job.to_dict()
    assert d["model"]["kv_heads"] == 16 and d["model"]["ffn_hidden"] == 4096
    assert TrainingJob.from_dict(d) == job
    assert job.gpus == 8
    # The pipeline split keys, with their defaults: NeoX's rule, no explicit split.
    assert {k: d["layout"][k] for k in ("pipe_split", "stage_layers", "first_stage_layers",
                                         "last_stage_layers", "account_for_embedding",
                                         "account_for_loss")} == {
        "pipe_split": "neox", "stage_layers": [], "first_stage_layers": 0, "last_stage_layers": 0,
        "account_for_embedding": False, "account_for_loss": False}
    split = TrainingJob.from_dict(with_("layout", stage_layers=[3, 5]))
    assert TrainingJob.from_dict(split.to_dict()) == split and split.layout.stage_layers == (3, 5)


@pytest.mark.parametrize("section,kv,key", [
    ("layout", {"tp": 3}, "layout.tp"),                 # heads % tp
    ("model", {"kv_heads": 6}, "model.kv_heads"),       # heads % kv_heads
    ("layout", {"pp": 16}, "layout.pp"),                # layers < pp
    ("layout", {"virtual_stages": 3}, "layout.virtual_stages"),
    ("model", {"hidden": 1000}, "model.heads"),         # hidden % heads
    ("layout", {"zero_stage": 2}, "layout.zero_stage"), # ZeRO-2 with pp > 1
    ("layout", {"zero_stage": 5}, "layout.zero_stage"),
    ("model", {"hidden": 10**9}, "model.hidden"),       # absurd size
    ("layout", {"micro_batch": 0}, "layout.micro_batch"),
    ("model", {"norm": "batchnorm"}, "model.norm"),
    ("model", {"layers": 4.5}, "model.layers"),
    ("model", {"parallel_residual": "yes"}, "model.parallel_residual"),
    ("layout", {"pipe_split": "magic"}, "layout.pipe_split"),
    ("layout", {"stage_layers": [3, 3]}, "layout.stage_layers"),      # sums to 6, not 8
    ("layout", {"stage_layers": [8]}, "layout.stage_layers"),         # pp = 2 needs 2 entries
    ("layout", {"stage_layers": ["4", 4]}, "layout.stage_layers"),
    ("layout", {"pipe_split": "megatron", "pp": 3, "dp": 1}, "layout.pp"),   # 8 layers over 3
    ("layout", {"last_stage_layers": 2}, "layout.last_stage_layers"),        # megatron only
])
def test_bad_values_name_the_key(section, kv, key):
    with pytest.raises(JobError) as e:
        TrainingJob.from_dict(with_(section, **kv))
    assert e.value.key == key
    assert key in str(e.value)


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(JobError) as e:
        TrainingJob.from_dict(with_("model", hiden=3))
    assert e.value.key == "model.hiden" and "hidden" in str(e.value)
    with pytest.raises(JobError) as e:
        TrainingJob.from_dict({**BASE, "layot": {}})
    assert "layout" in str(e.value)


def test_missing_required_key():
    d = with_("model")
    del d["model"]["seq_len"]
    with pytest.raises(JobError, match="model.seq_len"):
        TrainingJob.from_dict(d)


def test_toml_errors_name_the_file(tmp_path):
    p = tmp_path / "job.toml"
    p.write_text("[model]\nlayers = = 3\n")
    with pytest.raises(JobError, match="job.toml.*line 2"):
        TrainingJob.from_toml(p)
    with pytest.raises(JobError, match="cannot read"):
        TrainingJob.from_toml(tmp_path / "absent.toml")


def test_iterations_from_samples_and_tokens():
    d = with_("run", train_samples=1000)
    d["layout"].update(micro_batch=2, micro_batches=4)   # global batch 16
    assert TrainingJob.from_dict(d).iterations == 63
    d = with_("run", train_tokens=512 * 16 * 10)
    d["layout"].update(micro_batch=2, micro_batches=4)
    assert TrainingJob.from_dict(d).iterations == 10


def test_float_integers_from_configs_accepted():
    job = TrainingJob.from_dict(with_("model", layers=8.0))
    assert job.model.layers == 8 and isinstance(job.model.layers, int)


@pytest.mark.parametrize("framework, rule", [("megatron", "megatron"), ("nemo", "megatron"),
                                             ("torchtitan", "megatron"), ("neox", "neox"),
                                             ("megatron-deepspeed", "neox"), ("", "neox")])
def test_a_framework_without_a_split_rule_gets_its_own(framework, rule):
    job = TrainingJob.from_dict(with_("run", framework=framework))
    assert job.layout.pipe_split == rule
    # An explicit rule wins, and a job written out keeps the rule it had.
    explicit = with_("run", framework=framework)
    explicit["layout"]["pipe_split"] = "deepspeed_uniform"
    assert TrainingJob.from_dict(explicit).layout.pipe_split == "deepspeed_uniform"
    assert TrainingJob.from_dict(job.to_dict()) == job


def test_megatrons_rule_refuses_what_megatron_refuses_naming_pp():
    bad = with_("run", framework="megatron")
    bad["model"]["layers"] = 9                       # 9 layers over pp = 2: Megatron refuses
    with pytest.raises(JobError) as err:
        TrainingJob.from_dict(bad)
    assert err.value.key == "layout.pp"


def test_llm_foundry_runs_no_pipeline_and_no_context_parallelism():
    """Composer trains with FSDP (and TP): a pp or cp layout would never launch, so neither job
    validation nor perf-advise's enumeration may offer one."""
    job = TrainingJob.from_dict({"model": dict(GPT20B, attention="flash"),
                                 "layout": {"pp": 1, "tp": 1, "dp": 8, "zero_stage": 3},
                                 "run": {"train_iters": 10, "framework": "llm-foundry"}})
    for key, change in (("layout.pp", {"pp": 2, "zero_stage": 1}), ("layout.cp", {"cp": 2})):
        lay = dataclasses.replace(job.layout, **change)
        with pytest.raises(JobError) as exc:
            check_layout(job.model, lay, "llm-foundry")
        assert exc.value.key == key
        check_layout(job.model, lay, "")          # other frameworks keep them


def test_a_job_file_gives_its_length_once_and_never_as_zero(tmp_path):
    base = "[model]\nlayers = 2\nhidden = 512\nheads = 8\nseq_len = 1024\nvocab = 32000\n[run]\n"
    f = tmp_path / "j.toml"
    f.write_text(base + "train_iters = 100\ntrain_tokens = 1_000_000\n")
    with pytest.raises(JobError, match=r"run.train_tokens: give one of .* not run.train_iters and run.train_tokens"):
        TrainingJob.from_toml(f)
    f.write_text(base + "train_samples = 0\n")
    with pytest.raises(JobError, match=r"run.train_samples: must be at least 1"):
        TrainingJob.from_toml(f)
    f.write_text(base + "train_tokens = 1_000_000\n")
    assert TrainingJob.from_toml(f).run.train_tokens == 1_000_000
