"""NeMo 1.x Hydra launches are read from their YAML + overrides; NeMo 2.0 recipes are refused."""
from __future__ import annotations

import pathlib

import pytest

from .helpers import parse_in

HEAD = "#!/bin/bash\n#SBATCH --nodes=1 --ntasks-per-node=8 --gpus-per-node=8\n"
CONF = """trainer:
  devices: 8
  num_nodes: 1
  precision: 16-mixed
  max_steps: 1000
  val_check_interval: 100
  limit_val_batches: 10
exp_manager:
  checkpoint_callback_params:
    every_n_train_steps: 200
model:
  micro_batch_size: 2
  global_batch_size: 64
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 1
  encoder_seq_length: 2048
  num_layers: 24
  hidden_size: 2048
  ffn_hidden_size: ${multiply:4,${.hidden_size}}
  num_attention_heads: 16
  num_query_groups: 4
  activation: gelu
  masked_softmax_fusion: True
  virtual_pipeline_model_parallel_size: null
  activations_checkpoint_granularity: null
  activations_checkpoint_method: null
  use_flash_attention: False
  optim:
    name: fused_adam
"""
LAUNCH = "srun python /opt/NeMo/examples/nlp/language_modeling/megatron_gpt_pretraining.py " \
         "--config-path=$PWD/conf --config-name=gpt "


def _run(tmp_path: pathlib.Path, body: str, conf: str | None = CONF):
    return parse_in(tmp_path, HEAD + body, {"conf/gpt.yaml": conf} if conf is not None else None)


def test_base_config_and_overrides(tmp_path):
    res = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192 ++model.sequence_parallel=true\n")
    assert res.error is None, res.error
    j = res.job
    assert (j.model.layers, j.model.hidden, j.model.kv_heads, j.model.ffn_hidden) == (24, 2048, 4, 8192)
    assert (j.layout.tp, j.layout.dp, j.layout.micro_batch, j.layout.micro_batches) == (2, 4, 2, 8)
    assert j.layout.zero_stage == 0 and j.layout.sequence_parallel is True
    assert j.model.attention == "fused_softmax" and j.run.precision == "fp16" and j.run.framework == "nemo"
    assert (j.run.train_iters, j.run.eval_interval, j.run.eval_iters, j.run.save_interval) == (1000, 100, 10, 200)
    assert res.provenance["model.layers"].endswith("conf/gpt.yaml:17")
    assert res.provenance["model.ffn_hidden"].endswith("job.sbatch:3 (override model.ffn_hidden_size)")


def test_delete_override_and_distributed_optimizer(tmp_path):
    res = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192 ~model.num_query_groups "
               "model.optim.name=distributed_fused_adam model.activations_checkpoint_granularity=full "
               "model.activations_checkpoint_method=uniform model.use_flash_attention=true trainer.precision=bf16\n")
    assert res.error is None, res.error
    j = res.job
    assert j.model.kv_heads == j.model.heads          # ~key: deleted, the default (no GQA)
    assert j.layout.zero_stage == 1 and j.layout.recompute == "full"
    assert j.model.attention == "flash" and j.run.precision == "bf16"


def test_resolver_interpolation_is_unknown_and_named(tmp_path):
    res = _run(tmp_path, LAUNCH + "\n")
    # ${multiply:...} is an OmegaConf resolver, not a key: ffn_hidden_size is unknown, with its line
    assert res.error is None and "model.ffn_hidden" in res.unresolved
    assert any("model.ffn_hidden_size" in w and "conf/gpt.yaml:19" in w for w in res.warnings)


def test_interpolation_loop_is_bounded(tmp_path):
    conf = CONF.replace("num_layers: 24", "num_layers: ${.num_layers}")
    res = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192\n", conf)
    assert res.job is None and "model.layers" in res.error


def test_trainer_world_must_match_the_launch(tmp_path):
    """srun starts 8 ranks, the trainer asks for 1 × 4: Lightning's SLURMEnvironment.validate_settings
    raises at start-up, so there is no job to predict."""
    res = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192 trainer.devices=4\n")
    assert res.job is None
    assert "trainer.num_nodes × trainer.devices = 1 × 4" in res.error and "Lightning stops" in res.error, res.error
    assert "starts 8 process(es)" in res.error and res.error.endswith("job.sbatch:3 (override trainer.devices))")


def test_fp8_is_delayed_scaling_on_top_of_bf16(tmp_path):
    res = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192 +model.fp8=true\n")
    assert res.job.run.precision == "bf16" and res.job.run.fp8 == "delayed"


def test_fp8_recipe_other_than_delayed_is_current_scaling(tmp_path):
    res = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192 +model.fp8=true +model.fp8_recipe=tensorwise\n")
    assert res.job.run.fp8 == "current"


def test_moe_is_refused(tmp_path):
    res = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192 +model.num_moe_experts=8\n")
    assert res.job is None
    assert "mixture-of-experts models are not modelled yet" in res.error and "num_moe_experts = 8" in res.error
    assert "job.sbatch:3 (override model.num_moe_experts)" in res.error


def test_missing_config_names_the_file(tmp_path):
    res = _run(tmp_path, LAUNCH.replace("--config-name=gpt", "--config-name=nope") + "\n")
    assert res.job is None and "nope.yaml" in res.error and "no such file" in res.error


def test_default_config_is_the_scripts_conf_dir(tmp_path):
    res = _run(tmp_path, "srun python /opt/NeMo/examples/nlp/language_modeling/megatron_gpt_pretraining.py "
                         "trainer.devices=8\n", conf=None)
    assert res.job is None
    assert "/opt/NeMo/examples/nlp/language_modeling/conf/megatron_gpt_config.yaml" in res.error


def test_nemo2_cli_is_refused(tmp_path):
    res = _run(tmp_path, "srun nemo llm pretrain --factory llama3_8b trainer.num_nodes=1 -y\n", conf=None)
    assert res.job is None and "NeMo 2.0" in res.error and "TOML job file" in res.error


def test_nemo2_recipe_script_is_refused(tmp_path):
    (tmp_path / "pretrain_llama.py").write_text(
        "import nemo_run as run\nfrom nemo.collections import llm\n\n"
        "recipe = llm.llama3_8b.pretrain_recipe(num_nodes=2)\nrun.run(recipe)\n")
    res = _run(tmp_path, "srun --container-image nvcr.io/nvidia/nemo:24.12 python pretrain_llama.py\n", conf=None)
    assert res.job is None and "NeMo 2.0" in res.error and "pretrain_llama.py:1" in res.error


@pytest.mark.parametrize("bad", ["trainer: [1, 2]\nmodel: 3\n", "- a\n- b\n"])
def test_odd_config_shapes_are_one_line_errors(tmp_path, bad):
    res = _run(tmp_path, LAUNCH + "\n", bad)
    assert res.job is None and res.error.startswith("cannot predict: ") and "internal" not in res.error


def test_devices_auto_uses_the_launch(tmp_path):
    res = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192 trainer.devices=auto\n")
    assert res.error is None, res.error
    assert res.job.layout.dp == 4        # srun: 8 tasks / tp 2


def test_neox_missing_shape_key_names_the_configs(tmp_path):
    (tmp_path / "a.yml").write_text('{"num_layers": 2, "hidden_size": 64, "seq_length": 128}\n')
    res = _run(tmp_path, "python deepy.py train.py a.yml\n", conf=None)
    assert res.job is None and "num_attention_heads is in none of the NeoX configs (a.yml)" in res.error


def test_virtual_and_context_parallel(tmp_path):
    res = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192 model.pipeline_model_parallel_size=2 "
                                  "model.virtual_pipeline_model_parallel_size=3 +model.context_parallel_size=2 "
                                  "model.tensor_model_parallel_size=1 model.use_flash_attention=True "
                                  "trainer.val_check_interval=0.25\n")
    assert res.error is None, res.error
    lay = res.job.layout
    assert (lay.pp, lay.virtual_stages, lay.cp, lay.tp, lay.dp) == (2, 3, 2, 1, 2)
    assert res.job.run.eval_interval == 0
    assert any("val_check_interval 0.25" in w or "val_check_interval '0.25'" in w for w in res.warnings)


def test_unknown_expert_count_is_refused(tmp_path):
    res = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192 +model.num_moe_experts=$(cat /nonexistent/e)\n")
    assert res.job is None and "model.num_moe_experts is unknown" in res.error


def test_override_back_to_dense_is_honoured(tmp_path):
    conf = CONF.replace("  num_layers: 24", "  num_moe_experts: 8\n  num_layers: 24")
    res = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192 model.num_moe_experts=1\n", conf)
    assert res.error is None, res.error
    res = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192\n", conf)
    assert res.job is None and "num_moe_experts = 8" in res.error and "gpt.yaml:17" in res.error


@pytest.mark.parametrize("form", ["--config-path $PWD/conf --config-name gpt", "-cp $PWD/conf -cn gpt.yaml",
                                  "--config-path=conf --config-name=gpt"])
def test_config_path_spellings(tmp_path, form):
    # the last form is relative to the training script's directory, as Hydra resolves it
    script = "megatron_gpt_pretraining.py" if "=conf" in form else \
        "/opt/NeMo/examples/nlp/language_modeling/megatron_gpt_pretraining.py"
    res = _run(tmp_path, f"srun python {script} {form} model.ffn_hidden_size=8192 hydra.run.dir=/tmp/x\n")
    assert res.error is None, res.error
    assert res.job.model.layers == 24


def test_communication_overlaps(tmp_path):
    res = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192 ++model.sequence_parallel=true "
               "+model.ub_tp_comm_overlap=true model.optim.name=distributed_fused_adam\n")
    assert res.error is None, res.error
    # The TP overlap with sequence parallelism becomes the layout key; distributed Adam overlaps
    # its gradient reduction by default, the parameter gather is off.
    assert not any("costed serially" in w or "costed without" in w for w in res.warnings)
    assert res.job.layout.tp_comm_overlap
    assert res.provenance["layout.tp_comm_overlap"].startswith("model.ub_tp_comm_overlap (")
    assert "job.sbatch:3" in res.provenance["layout.tp_comm_overlap"]
    assert res.job.layout.overlap_grad_reduce and not res.job.layout.overlap_param_gather
    # Without sequence parallelism NeMo turns it off: said and dropped.
    no_sp = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192 +model.ub_tp_comm_overlap=true\n")
    assert no_sp.error is None, no_sp.error
    assert not no_sp.job.layout.tp_comm_overlap
    assert any(w.startswith("model.ub_tp_comm_overlap (") and "needs sequence parallelism" in w
               for w in no_sp.warnings)
    assert "distributed_fused_adam (overlap_grad_sync defaults on)" in res.provenance["layout.overlap_grad_reduce"]
    both = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192 model.optim.name=distributed_fused_adam "
                "+model.optim.overlap_param_sync=true\n")
    assert both.job.layout.overlap_grad_reduce and both.job.layout.overlap_param_gather
    # The parameter gather without the gradient overlap: Megatron refuses it; said and dropped.
    off = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192 model.optim.name=distributed_fused_adam "
               "+model.optim.overlap_grad_sync=false +model.optim.overlap_param_sync=true\n")
    assert off.error is None, off.error
    assert not off.job.layout.overlap_grad_reduce and not off.job.layout.overlap_param_gather
    assert any(w.startswith("model.optim.overlap_param_sync") and "gradient overlap" in w for w in off.warnings)
    plain = _run(tmp_path, LAUNCH + "model.ffn_hidden_size=8192\n")
    assert not any("costed serially" in w for w in plain.warnings)
    assert not plain.job.layout.overlap_grad_reduce


# ---- a misspelt key in the base YAML: a near miss of a key the reader uses stops at its line
def _conf_line(conf: str, start: str) -> int:
    return 1 + next(i for i, t in enumerate(conf.splitlines()) if t.strip().startswith(start))


@pytest.mark.parametrize("old, new, meant", [
    ("  tensor_model_parallel_size: 2", "  tensor_model_paralel_size: 2", "model.tensor_model_parallel_size"),
    ("  pipeline_model_parallel_size: 1", "  pipline_model_parallel_size: 2", "model.pipeline_model_parallel_size"),
    ("  num_layers: 24", "  num_layer: 24", "model.num_layers"),
    ("    name: fused_adam", "    nme: fused_adam", "model.optim.name"),
    ("  max_steps: 1000", "  max_stpes: 1000", "trainer.max_steps"),
])
def test_misspelt_read_key_in_the_base_config_stops_at_its_line(tmp_path, old, new, meant):
    assert old in CONF
    conf = CONF.replace(old, new)
    res = _run(tmp_path, LAUNCH + "\n", conf)
    assert res.job is None, res.warnings
    assert f"did you mean {meant}?" in res.error, res.error
    assert f"{meant.rpartition('.')[0]}.{new.strip().split(':')[0]} is not" in res.error, res.error
    assert res.error.endswith(f"conf/gpt.yaml:{_conf_line(conf, new.strip())})"), res.error


def test_qa_h07_pipeline_typo_is_not_predicted_as_pp1(tmp_path):
    conf = CONF.replace("  pipeline_model_parallel_size: 1", "  pipline_model_parallel_size: 2")
    res = _run(tmp_path, LAUNCH + "\n", conf)
    assert res.job is None
    assert ("model.pipline_model_parallel_size is not a NeMo config key and would be ignored; did you mean "
            "model.pipeline_model_parallel_size?") in res.error
    assert res.error.endswith(f"gpt.yaml:{_conf_line(conf, 'pipline_model_parallel_size')})"), res.error


def test_trainer_typo_names_lightning(tmp_path):
    conf = CONF.replace("  num_nodes: 1", "  num_node: 1")
    res = _run(tmp_path, LAUNCH + "\n", conf)
    assert res.job is None and "not an argument of Lightning's Trainer" in res.error
    assert "did you mean trainer.num_nodes?" in res.error


@pytest.mark.parametrize("extra", [
    "  expert_model_parallel_size: 1\n",              # real NeMo keys near keys the reader uses
    "  pipeline_model_parallel_split_rank: 0\n",
    "  decoder_seq_length: 512\n",
    "  ub_tp_comm_overlap_cfg: null\n",
    "  activations_checkpoint_num_layers: null\n",
    "  my_own_setting: 3\n",                          # far from every read key
    "  init_method_std: 0.02\n",
])
def test_other_unknown_or_real_keys_pass_silently(tmp_path, extra):
    conf = CONF.replace("model:\n", "model:\n" + extra)
    res = _run(tmp_path, LAUNCH + "\n", conf)
    assert res.error is None, res.error
    key = extra.strip().split(":")[0]
    assert not [w for w in res.warnings if key in w], res.warnings


def test_real_trainer_keys_near_read_ones_pass(tmp_path):
    conf = CONF.replace("trainer:\n", "trainer:\n  limit_test_batches: 5\n  limit_train_batches: 1.0\n")
    res = _run(tmp_path, LAUNCH + "\n", conf)
    assert res.error is None, res.error


def test_misspelt_key_beside_the_key_it_misspells_is_a_warning(tmp_path):
    conf = CONF.replace("  pipeline_model_parallel_size: 1", "  pipeline_model_parallel_size: 1\n"
                        "  pipline_model_parallel_size: 2")
    res = _run(tmp_path, LAUNCH + "\n", conf)
    assert res.error is None, res.error
    assert res.job.layout.pp == 1
    assert any("pipline_model_parallel_size" in w and "did you mean model.pipeline_model_parallel_size?" in w
               for w in res.warnings), res.warnings


def test_every_megatron_core_config_field_is_a_known_model_key():
    # NeMo passes the model config's keys that are Megatron-core TransformerConfig (and
    # ModelParallelConfig) fields on to it: none may be taken for a misspelling of a key perfcast
    # reads (tp_comm_overlap is no typo of ub_tp_comm_overlap).
    import dataclasses
    import warnings as _warnings

    from slurm_plugin.launch import nemo
    from slurm_plugin.launch.neox_keys import suggest
    with _warnings.catch_warnings():
        _warnings.simplefilter("ignore")
        transformer_config = pytest.importorskip("megatron.core.transformer.transformer_config",
                                                 reason="megatron-core is not installed")
        parallel_config = pytest.importorskip("megatron.core.model_parallel_config")
    fields = {f.name for c in (transformer_config.TransformerConfig, parallel_config.ModelParallelConfig)
              for f in dataclasses.fields(c)}
    known, read = nemo.KNOWN_KEYS["model"], nemo.READ_BY_SCOPE["model"]
    taken = sorted(n for n in fields if n not in known and suggest(n, known) in read)
    assert not taken, taken
