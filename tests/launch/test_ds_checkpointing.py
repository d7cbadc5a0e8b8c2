"""DeepSpeed's activation-checkpointing options read from launches: GPT-NeoX's keys, Megatron-
DeepSpeed's flags (which override the DeepSpeed JSON's section), only for checkpointed layers, and
what they do to the prediction."""
from __future__ import annotations

import json

from predictor import load_platform, predict
from predictor.memory import estimate_job

from .helpers import parse_in

# A GPT-NeoX 20B-style config (dash spelling, as NeoX's older configs write it), 2 nodes of 8.
NEOX_YML = """{
  "pipe-parallel-size": 2,
  "model-parallel-size": 4,
  "num-layers": 44,
  "hidden-size": 6144,
  "num-attention-heads": 64,
  "seq-length": 2048,
  "max-position-embeddings": 2048,
  "pos-emb": "rotary",
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 8,
  "zero_optimization": {"stage": 1},
  "fp16": {"enabled": true},
  "train-iters": 1000,
  %s
}
"""
NEOX_SH = "#!/bin/bash\n#SBATCH -N 2 --gres=gpu:8\npython deepy.py train.py 20B.yml\n"


def _neox(tmp_path, keys: str):
    res = parse_in(tmp_path, NEOX_SH, {"20B.yml": NEOX_YML % keys})
    assert res.error is None, res.error
    return res


def test_neox_keys_fill_the_layout(tmp_path):
    res = _neox(tmp_path, '"checkpoint-activations": true,\n  "checkpoint-num-layers": 1,\n'
                          '  "partition-activations": true,\n  "synchronize-each-layer": true,')
    lay = res.job.layout
    assert (lay.recompute, lay.partition_activations, lay.checkpoint_sync_each_layer, lay.checkpoint_in_cpu) \
        == ("full", True, True, False)
    assert res.provenance["layout.partition_activations"].endswith("20B.yml:17")
    assert res.provenance["layout.checkpoint_sync_each_layer"].endswith("20B.yml:18")


def test_neox_keys_without_checkpointing_are_said_and_left_off(tmp_path):
    res = _neox(tmp_path, '"partition_activations": true,\n  "checkpoint_in_cpu": true,')
    lay = res.job.layout
    assert lay.recompute == "none" and not lay.partition_activations and not lay.checkpoint_in_cpu
    assert any("partition_activations, checkpoint_in_cpu without checkpoint_activations" in w
               and "20B.yml:15" in w for w in res.warnings), res.warnings


def test_neox_misspelt_option_stops_with_a_suggestion(tmp_path):
    res = parse_in(tmp_path, NEOX_SH, {"20B.yml": NEOX_YML % '"checkpoint_activations": true,\n'
                                                             '  "partition_activation": true,'})
    assert res.error and "did you mean 'partition_activations'" in res.error


def test_neox_contiguous_without_partition_is_a_start_up_failure(tmp_path):
    res = _neox(tmp_path, '"checkpoint_activations": true,\n  "contiguous_checkpointing": true,')
    assert any("contiguous_checkpointing without partition_activations" in w for w in res.warnings)


def test_neox_prediction_moves_with_the_options(tmp_path):
    plain = _neox(tmp_path / "a", '"checkpoint_activations": true,').job
    opts = _neox(tmp_path / "b", '"checkpoint_activations": true,\n  "partition_activations": true,\n'
                                 '  "synchronize_each_layer": true,').job
    plat = load_platform("perlmutter-a100")
    assert predict(opts, plat).iteration_seconds > predict(plain, plat).iteration_seconds
    assert estimate_job(opts).activations < estimate_job(plain).activations


MDS = ("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=8 --gpus-per-node=8\n"
       "srun python pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \\\n"
       "  --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 512 \\\n"
       "  --tensor-model-parallel-size 4 --train-iters 1000 --bf16 --deepspeed --deepspeed_config ds.json \\\n"
       "  {extra}\n")
DS_JSON = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}


def _mds(tmp_path, extra, ds=None):
    res = parse_in(tmp_path, MDS.format(extra=extra), {"ds.json": json.dumps(ds or DS_JSON, indent=1)})
    assert res.error is None, res.error
    assert res.framework == "megatron-deepspeed"
    return res


def test_megatron_deepspeed_flags_fill_the_layout(tmp_path):
    res = _mds(tmp_path, "--checkpoint-activations --deepspeed-activation-checkpointing "
                         "--partition-activations --checkpoint-in-cpu")
    lay = res.job.layout
    assert (lay.partition_activations, lay.checkpoint_in_cpu, lay.checkpoint_sync_each_layer) == (True, True, False)
    assert res.provenance["layout.checkpoint_in_cpu"].endswith("job.sbatch:6")


def test_megatron_deepspeed_flags_need_deepspeeds_checkpointing(tmp_path):
    res = _mds(tmp_path, "--checkpoint-activations --synchronize-each-layer")
    assert not res.job.layout.checkpoint_sync_each_layer
    assert any("--synchronize-each-layer without --deepspeed-activation-checkpointing" in w for w in res.warnings)


def test_megatron_deepspeed_flags_without_recompute_are_said(tmp_path):
    res = _mds(tmp_path, "--deepspeed-activation-checkpointing --partition-activations")
    assert res.job.layout.recompute == "none" and not res.job.layout.partition_activations
    assert any("--partition-activations without activation recomputation" in w for w in res.warnings)


def test_the_json_section_is_overridden_by_the_flags_and_said(tmp_path):
    ds = dict(DS_JSON, activation_checkpointing={"partition_activations": True, "cpu_checkpointing": False,
                                                 "synchronize_checkpoint_boundry": True})
    res = _mds(tmp_path, "--checkpoint-activations --deepspeed-activation-checkpointing", ds)
    assert not res.job.layout.partition_activations
    assert any("activation_checkpointing.partition_activations" in w and "override the config" in w
               for w in res.warnings), res.warnings
    # A misspelt option DeepSpeed would silently ignore is said, with the likely key.
    assert any("'synchronize_checkpoint_boundry'" in w and "synchronize_checkpoint_boundary" in w
               for w in res.warnings), res.warnings


def test_megatron_deepspeed_prediction_moves_with_partitioning(tmp_path):
    plain = _mds(tmp_path / "a", "--checkpoint-activations --deepspeed-activation-checkpointing").job
    part = _mds(tmp_path / "b", "--checkpoint-activations --deepspeed-activation-checkpointing "
                                "--partition-activations").job
    plat = load_platform("dgx-a100")
    p0, p1 = predict(plain, plat), predict(part, plat)
    assert p1.breakdown.tp_allreduce_seconds > p0.breakdown.tp_allreduce_seconds
    assert estimate_job(part).activations < estimate_job(plain).activations


def test_megatron_deepspeed_misspelt_flag_stops_with_a_suggestion(tmp_path):
    res = parse_in(tmp_path, MDS.format(extra="--checkpoint-activations --partition-activation"),
                   {"ds.json": json.dumps(DS_JSON)})
    assert res.error and "did you mean --partition-activations" in res.error


def test_neox_says_a_deepspeed_section_is_overridden_by_its_own_keys(tmp_path):
    res = _neox(tmp_path, '"checkpoint_activations": true,\n'
                          '  "activation_checkpointing": {"partition_activations": true},')
    assert not res.job.layout.partition_activations
    assert any(w.startswith("activation_checkpointing: GPT-NeoX configures") for w in res.warnings), res.warnings


MEGATRON_LM = ("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=8 --gpus-per-node=8\n"
               "srun python pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \\\n"
               "  --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 512 \\\n"
               "  --tensor-model-parallel-size 4 --train-iters 1000 --bf16 \\\n"
               "  --recompute-granularity full --recompute-method uniform {extra}\n")


def test_megatron_lm_distribute_saved_activations_is_partitioning(tmp_path):
    res = parse_in(tmp_path, MEGATRON_LM.format(extra="--distribute-saved-activations"))
    assert res.error is None and res.framework == "megatron"
    assert res.job.layout.partition_activations
    assert res.provenance["layout.partition_activations"].endswith("job.sbatch:6")


def test_megatron_lm_distribute_saved_activations_is_off_under_sequence_parallelism(tmp_path):
    res = parse_in(tmp_path, MEGATRON_LM.format(extra="--distribute-saved-activations --sequence-parallel"))
    assert res.error is None and not res.job.layout.partition_activations
    assert any("Megatron-core turns it off" in w for w in res.warnings), res.warnings

