"""llm-foundry: OmegaConf YAML + dotted overrides, MPT shape, Composer FSDP layout, Composer durations."""
from __future__ import annotations

import pytest

from slurm_plugin.launch.llmfoundry import DEFAULT_ATTN_IMPL, duration
from slurm_plugin.launch.llmfoundry_keys import READ_KEYS, TRAIN_CONFIG_KEYS
from slurm_plugin.launch.limits import CannotPredict

from .conftest import DATA
from .helpers import parse_in

MPT7B = (DATA / "llmfoundry" / "mpt-7b-h100.yaml").read_text()
MPT1B = (DATA / "llmfoundry" / "mpt-1b-gqa.yaml").read_text()
HEAD = "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8\n"
COMPOSER = ("srun composer --world_size 16 --node_rank $SLURM_NODEID --master_addr node1 -n 8 "
            "scripts/train/train.py mpt.yaml ")


def _run(tmp_path, body: str, yaml: str = MPT7B, head: str = HEAD):
    return parse_in(tmp_path, head + body, {"mpt.yaml": yaml})


def _ok(res):
    assert res.error is None, res.error
    return res.job


def test_mpt7b_under_composer_launcher(tmp_path):
    res = _run(tmp_path, COMPOSER + "\n")
    j = _ok(res)
    m, lay, run = j.model, j.layout, j.run
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab) == (32, 4096, 32, 32, 16384, 50368)
    assert m.seq_len == 8192                                    # ${variables.max_seq_len}
    assert (m.attention, m.attention_impl, m.pos_emb, m.norm, m.activation) == \
        ("flash", "triton", "alibi", "layernorm", "gelu")
    assert (lay.dp, lay.tp, lay.pp, lay.zero_stage, lay.recompute) == (16, 1, 1, 3, "full")
    assert (lay.micro_batch, lay.micro_batches) == (4, 4)      # 256 / 16 GPUs = 16 per GPU in 4s
    assert (run.framework, run.train_iters, run.precision, run.grad_reduce_precision) == \
        ("llm-foundry", 20000, "bf16", "bf16")                  # PURE: reduced in the training precision
    assert (run.eval_interval, run.eval_iters, run.save_interval) == (2000, 20, 5000)
    assert res.provenance["model.seq_len"].endswith("mpt.yaml:5")
    assert res.provenance["model.attention_impl"].endswith("mpt.yaml:22")


def test_overrides_win_and_name_their_argument(tmp_path):
    body = COMPOSER + ("model.n_layers=48 variables.max_seq_len=4096 fsdp_config.sharding_strategy=SHARD_GRAD_OP "
                       "fsdp_config.mixed_precision=DEFAULT max_duration=10ba model.attn_config.attn_impl=torch\n")
    res = _run(tmp_path, body)
    j = _ok(res)
    assert (j.model.layers, j.model.seq_len, j.layout.zero_stage, j.run.train_iters) == (48, 4096, 2, 10)
    assert j.run.grad_reduce_precision == "fp32"
    assert j.model.attention == "unfused" and j.model.attention_impl == ""    # llm-foundry's torch attention
    assert "(override model.n_layers)" in res.provenance["model.layers"]
    assert res.provenance["model.seq_len"].endswith("(override variables.max_seq_len)")


@pytest.mark.parametrize("launch", [
    "srun --ntasks-per-node=1 torchrun --nnodes 2 --nproc_per_node 8 llm-foundry/scripts/train/train.py mpt.yaml\n",
    "srun --ntasks-per-node=8 python llm-foundry/scripts/train/train.py mpt.yaml\n",
    "srun python -m composer --world_size 16 -n 8 train.py mpt.yaml\n",
])
def test_launch_forms(tmp_path, launch):
    j = _ok(_run(tmp_path, launch))
    assert j.run.framework == "llm-foundry" and j.layout.dp == 16 and j.model.layers == 32


def test_gqa_rope_glu_tokens_and_hybrid_shard(tmp_path):
    res = _run(tmp_path, COMPOSER + "\n", MPT1B)
    j = _ok(res)
    m, lay, run = j.model, j.layout, j.run
    assert (m.kv_heads, m.ffn_hidden, m.activation, m.pos_emb, m.norm) == (4, 5632, "swiglu", "rotary", "rmsnorm")
    assert (m.attention, m.attention_impl) == ("flash", "flash2")
    assert (lay.zero_stage, lay.dp_shard, lay.recompute) == (3, 8, "none")   # HYBRID_SHARD: within a node
    assert (lay.micro_batch, lay.micro_batches) == (16, 2)
    assert run.train_iters == -(-26_000_000_000 // (512 * 2048))               # tokens -> batches, rounded up
    assert (run.eval_interval, run.save_interval) == (0, 0)                    # no eval_loader, no save_folder


def test_default_attention_is_llmfoundrys_current_default(tmp_path):
    yaml = MPT7B.replace("    attn_impl: triton\n", "")
    res = _run(tmp_path, COMPOSER + "\n", yaml)
    j = _ok(res)
    assert DEFAULT_ATTN_IMPL == "flash" and j.model.attention_impl == "flash2"
    assert "llm-foundry default" in res.provenance["model.attention_impl"]


@pytest.mark.parametrize("mixed, words, reduce", [
    ("PURE", "", "bf16"),
    ("PURE", "precision=amp_fp16", "fp16"),
    ("DEFAULT", "", "fp32"),
    ("FULL", "", "fp32"),
    (None, "", "fp32"),                                             # Composer's default: DEFAULT
    ("\n    param_dtype: bf16", "", "bf16"),                        # no reduce_dtype: param_dtype's
    ("\n    param_dtype: bf16\n    reduce_dtype: float32", "", "fp32"),
])
def test_fsdp_mixed_precision_names_the_reduction_dtype(tmp_path, mixed, words, reduce):
    line = "" if mixed is None else f"  mixed_precision: {mixed}\n".replace(": \n", ":\n")
    res = _run(tmp_path, COMPOSER + words + "\n", MPT7B.replace("  mixed_precision: PURE\n", line))
    j = _ok(res)
    # PyTorch FSDP1 reduces in MixedPrecision.reduce_dtype (Composer: PURE = the autocast dtype).
    assert j.run.grad_reduce_precision == reduce
    assert any("FULL keeps FSDP's parameters in fp32" in w for w in res.warnings) == (mixed == "FULL")


def test_no_fsdp_config_is_ddp_and_micro_batch_capped(tmp_path):
    yaml = MPT7B[:MPT7B.index("fsdp_config:")] + "save_interval: 1000ba\n"
    yaml = yaml.replace("device_train_microbatch_size: 4", "device_train_microbatch_size: 32")
    res = _run(tmp_path, COMPOSER + "\n", yaml)
    j = _ok(res)
    assert (j.layout.zero_stage, j.layout.recompute, j.run.grad_reduce_precision) == (0, "none", "fp32")
    assert (j.layout.micro_batch, j.layout.micro_batches) == (16, 1)
    assert any("reduces it to 16" in w for w in res.warnings)


def test_amp_fp8_needs_transformer_engine_layers(tmp_path):
    res = _run(tmp_path, COMPOSER + "precision=amp_fp8\n")
    assert _ok(res).run.fp8 == "" and any("stay bf16" in w for w in res.warnings)
    res = _run(tmp_path, COMPOSER + "precision=amp_fp8 model.fc_type=te\n")
    assert _ok(res).run.fp8 == "delayed" and res.job.run.precision == "bf16"


@pytest.mark.parametrize("override, words", [
    ("max_duration=1ep", "epochs of the data set"),
    ("device_train_microbatch_size=auto", "'auto'"),
    ("global_train_batch_size=100", "not divisible by the 16 GPUs"),
    ("model.name=hf_causal_lm", "Hugging Face checkpoint"),
    ("model.attn_config.attn_impl=xformers", "not torch, flash or triton"),
    ("model.ffn_config.ffn_type=mb_moe", "mixture-of-experts"),
    ("fsdp_config.sharding_strategy=FULL", "is not one of"),
])
def test_refusals_name_the_reason_and_the_argument(tmp_path, override, words):
    res = _run(tmp_path, COMPOSER + override + "\n")
    assert res.job is None and words in res.error, res.error
    assert "job.sbatch:3" in res.error


@pytest.mark.parametrize("yaml_edit, where, words", [
    (("global_train_batch_size: 256", "global_train_bach_size: 256"), "mpt.yaml:",
     "did you mean global_train_batch_size?"),
    (("  n_layers: 32", "  n_layer: 32"), "mpt.yaml:17", "did you mean model.n_layers?"),
    (("    attn_impl: triton", "    attn_iml: triton"), "mpt.yaml:22", "did you mean model.attn_config.attn_impl?"),
    (("  sharding_strategy: FULL_SHARD", "  sharding_stratgy: FULL_SHARD"), "mpt.yaml:",
     "did you mean fsdp_config.sharding_strategy?"),
])
def test_misspelt_keys_stop_with_file_line(tmp_path, yaml_edit, where, words):
    res = _run(tmp_path, COMPOSER + "\n", MPT7B.replace(*yaml_edit))
    assert res.job is None and words in res.error and where in res.error, res.error


def test_unknown_top_level_key_stops_as_llmfoundry_does(tmp_path):
    res = _run(tmp_path, COMPOSER + "my_note=hello\n")
    assert res.job is None and "Unused parameter my_note" in res.error and "job.sbatch:3" in res.error
    res = _run(tmp_path, COMPOSER + "modle.n_layers=48\n")
    assert res.job is None and "Unused parameter modle" in res.error and "did you mean model?" in res.error
    # a config written before TrainConfig (no variables: section) keeps its own top-level variables
    old = MPT7B.replace("variables:\n", "shared:\n").replace("${variables.", "${shared.")
    old = old.replace("shared:\n  data_local", "data_local: /scratch/c4\nshared:\n  data_local")
    res = _run(tmp_path, COMPOSER + "\n", old)
    assert _ok(res).model.seq_len == 8192
    assert any("data_local is not an llm-foundry config key" in w and "releases before its TrainConfig only warned" in w
               for w in res.warnings)
    res = _run(tmp_path, COMPOSER + "\n", old.replace("global_train_batch_size:", "global_train_bach_size:"))
    assert res.job is None and "did you mean global_train_batch_size?" in res.error


def test_misspelt_override_stops_and_unused_keys_warn(tmp_path):
    res = _run(tmp_path, COMPOSER + "model.d_modle=2048\n")
    assert res.job is None and "did you mean model.d_model?" in res.error
    res = _run(tmp_path, COMPOSER + "model.my_flag=1 fsdp_config.prefetch_depth=2\n")
    _ok(res)
    assert any("model.my_flag is not an llm-foundry model key and is ignored" in w for w in res.warnings)
    assert any("fsdp_config.prefetch_depth" in w for w in res.warnings)


def test_key_lists():
    # every key the reader uses at the top level is one llm-foundry knows
    assert READ_KEYS[""] <= TRAIN_CONFIG_KEYS
    assert duration("26_000tok", "x", "o") == (26000, "tok") and duration(3, "x", "o") == (3, "ep")
    with pytest.raises(CannotPredict):
        duration("1e9tok", "max_duration", "f:1")


def test_predictor_costs_llmfoundry_as_it_runs(tmp_path):
    """FlashAttention-2 when a job file names the framework and no kernel; FSDP1's per-layer hooks
    (ZeRO-3) costed like FSDP2's (benchmarks/bench_fsdp1_host.py), where a host-bound job shows them,
    and, from a step's second micro-batch on, FSDP1's accumulation share more (predictor.host)."""
    import dataclasses

    from predictor.attention import default_impl
    from predictor.estimate import predict_many
    from predictor.platform import load_platform
    assert default_impl("llm-foundry", True) == default_impl("llm-foundry", False) == "flash2"
    tiny = (MPT7B.replace("  d_model: 4096", "  d_model: 256").replace("  n_heads: 32", "  n_heads: 4")
            .replace("max_seq_len: 8192", "max_seq_len: 512")
            .replace("device_train_microbatch_size: 4", "device_train_microbatch_size: 1"))
    job = _ok(_run(tmp_path, COMPOSER + "\n", tiny))
    named = {fw: dataclasses.replace(job, run=dataclasses.replace(job.run, framework=fw))
             for fw in ("llm-foundry", "", "torchtitan")}
    one = {f"{fw} m1": dataclasses.replace(j, layout=dataclasses.replace(j.layout, micro_batches=1))
           for fw, j in named.items()}
    named.update(one)
    got = dict(zip(named, (p.iteration_seconds for p in predict_many(list(named.values()),
                                                                    load_platform("dgx-h100")))))
    assert job.layout.micro_batches > 1
    assert got["llm-foundry"] > got["torchtitan"] > got[""]
    assert got["llm-foundry m1"] > got[" m1"] and got["llm-foundry m1"] == pytest.approx(got["torchtitan m1"])


@pytest.mark.parametrize("edit, words", [
    (("  n_layers: 32", "  n_layer: 32"), ["model.n_layer is not an llm-foundry model key",
                                          "did you mean model.n_layers?"]),
    (("global_train_batch_size: 256", "global_train_bach_size: 256"),
     ["global_train_bach_size is not an llm-foundry config key", "did you mean global_train_batch_size?"]),
])
def test_typo_messages_survive_the_daemons_redaction(tmp_path, edit, words):
    """What sbatch shows keeps perfcast's words and the user's own misspelt key, not the file's text."""
    from slurm_plugin.daemon.engine import redact
    marker = "SECRETprojectname42"
    yaml = MPT7B.replace(*edit).replace("run_name: mpt-7b-8k", f"run_name: {marker}")
    res = _run(tmp_path, COMPOSER + "\n", yaml)
    assert res.job is None
    shown = redact(res.error, [yaml], HEAD + COMPOSER)
    for w in words:
        assert w in shown, shown
    assert marker not in shown


def test_unresolvable_interpolation_stops_and_stray_arguments_warn(tmp_path):
    yaml = MPT7B.replace("  n_layers: 32", "  n_layers: ${variables.n_layers}")
    res = _run(tmp_path, COMPOSER + "\n", yaml)
    assert res.job is None and "model.n_layers: ${variables.n_layers} cannot be resolved" in res.error
    assert res.error.endswith("mpt.yaml:17)")
    res = _run(tmp_path, COMPOSER + "variables.n_layers=40\n", yaml)
    assert _ok(res).model.layers == 40
    res = _run(tmp_path, COMPOSER + "--verbose\n")
    _ok(res)
    assert any("'--verbose' is not a key=value override" in w for w in res.warnings)


@pytest.mark.parametrize("edit, override, words", [
    (("fsdp_config:\n  sharding_strategy: FULL_SHARD", "fsdp_config: [FULL_SHARD]\nx_fsdp:\n  sharding_strategy: FULL_SHARD"),
     "", "fsdp_config is list"),
    (("  expansion_ratio: 4", "  expansion_ratio: 'four'"), "", "model.expansion_ratio 'four' is not a positive"),
    (None, "fsdp_config.sharding_strategy=HYBRID_SHARD fsdp_config.data_parallel_shard_degree=3",
     "data_parallel_shard_degree 3 does not divide the 16 GPUs"),
    (None, "global_train_batch_size=lots", "not an integer"),
])
def test_malformed_values_stop_with_their_origin(tmp_path, edit, override, words):
    yaml = MPT7B.replace(*edit) if edit else MPT7B
    res = _run(tmp_path, COMPOSER + override + "\n", yaml)
    assert res.job is None and words in res.error, res.error
    assert "internal" not in res.error


def test_override_values_are_yaml_as_omegaconf_reads_them(tmp_path):
    j = _ok(_run(tmp_path, COMPOSER + "model.expansion_ratio=2.5 model.attn_config.alibi=false "
                                      "fsdp_config.activation_checkpointing=False\n"))
    assert (j.model.ffn_hidden, j.model.pos_emb, j.layout.recompute) == (10240, "learned", "none")


def test_composer_world_defaults_to_the_nodes_gpus(tmp_path):
    one_node = "#!/bin/bash\n#SBATCH --nodes=1 --gpus-per-node=4\n"
    res = _run(tmp_path, "composer scripts/train/train.py mpt.yaml global_train_batch_size=64\n", head=one_node)
    assert _ok(res).layout.dp == 4
    res = _run(tmp_path, "composer scripts/train/train.py mpt.yaml\n", head="#!/bin/bash\n#SBATCH --nodes=1\n")
    assert res.job is None and "composer -n not given and the GPUs per node unknown" in res.error
    res = _run(tmp_path, "srun composer -n 8 scripts/train/train.py mpt.yaml\n")     # 2 nodes, no --world_size
    assert _ok(res).layout.dp == 8 and any("on each of the 2 nodes" in w for w in res.warnings)


def test_compile_config_compiles_the_model_and_null_does_not(tmp_path):
    assert not _ok(_run(tmp_path, COMPOSER + "\n")).run.compile
    res = _run(tmp_path, COMPOSER + "\n", MPT7B + "compile_config: {}\n")
    assert _ok(res).run.compile and res.provenance["run.compile"].startswith(str(tmp_path))
    assert not _ok(_run(tmp_path, COMPOSER + "\n", MPT7B + "compile_config: null\n")).run.compile


@pytest.mark.parametrize("edit, bias", [("", True), ("  no_bias: true\n", False), ("  no_bias: false\n", True)])
def test_no_bias_drops_the_linear_biases_as_mpt_does(tmp_path, edit, bias):
    # MPTConfig's no_bias (default false) decides the linear layers' biases, whatever the norm.
    yaml = MPT1B.replace("model:\n", "model:\n" + edit, 1)
    res = _run(tmp_path, COMPOSER + "\n", yaml)
    j = _ok(res)
    assert j.model.norm == "rmsnorm" and j.model.linear_bias is bias
    assert ("mpt.yaml" in res.provenance["model.linear_bias"]) is bool(edit)
