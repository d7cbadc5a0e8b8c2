"""No typo is silent, Megatron and NeMo values: a value the framework refuses at start-up (argparse
choices, an assertion of Megatron's validate_args, a NeMo model-build check) stops the prediction
with the flag or key, its file:line and a did-you-mean; a value it accepts but perfcast models
approximately is a warning that says truthfully what is modelled."""
from __future__ import annotations

import json

import pytest

from .helpers import parse_in
from .test_nemo import CONF as NEMO_CONF
from .test_nemo import HEAD as NEMO_HEAD
from .test_nemo import LAUNCH as NEMO_LAUNCH

MEGATRON = ("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=8 --gpus-per-node=8\n"
            "srun python pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \\\n"
            "  --seq-length {seq} --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 512 \\\n"
            "  --train-iters 1000 --bf16 \\\n"
            "  {extra}\n")
DS_JSON = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}


def _megatron(tmp_path, extra: str, seq: int = 2048, deepspeed: bool = False):
    if deepspeed:
        extra += " --deepspeed --deepspeed_config ds.json"
    return parse_in(tmp_path, MEGATRON.format(seq=seq, extra=extra), {"ds.json": json.dumps(DS_JSON)})


def _modelled(res, value, want, quiet: str = ""):
    """The job was predicted with ``value`` (read from it) ``want``, and no warning names ``quiet``."""
    assert res.job is not None, res.error
    assert value(res.job) == want
    assert not quiet or not [w for w in res.warnings if quiet in w], res.warnings


def _warned(res, *parts):
    assert any(all(part in w for part in parts) for w in res.warnings), res.warnings


def _stops(res, *parts, line: str = "job.sbatch:6"):
    assert res.job is None, res.warnings
    for part in parts:
        assert part in res.error, res.error
    assert res.error.endswith(f"{line})"), res.error
    assert "\n" not in res.error


# ---- Megatron: assertions of validate_args (megatron/training/arguments.py; Megatron-DeepSpeed alike)
@pytest.mark.parametrize("extra", ["", "--position-embedding-type rope", "--use-rotary-position-embeddings"])
@pytest.mark.parametrize("deepspeed", [False, True])
def test_megatron_max_position_embeddings_below_the_sequence_stops(tmp_path, extra, deepspeed):
    res = _megatron(tmp_path, extra, seq=4096, deepspeed=deepspeed)
    _stops(res, "--max-position-embeddings 2048 is below the sequence length 4096", "job.sbatch:4",
           "asserts max_position_embeddings >= seq_length", "stops at start", line="job.sbatch:4")


def test_megatron_max_position_embeddings_at_the_sequence_passes(tmp_path):
    res = _megatron(tmp_path, "--position-embedding-type rope", seq=2048)
    assert res.job is not None, res.error
    assert res.job.model.pos_emb == "rotary"


@pytest.mark.parametrize("deepspeed", [False, True])
def test_megatron_fp16_with_bf16_stops(tmp_path, deepspeed):
    _stops(_megatron(tmp_path, "--fp16", deepspeed=deepspeed), "--fp16 with --bf16", "assert not args.bf16",
           "stops at start")


@pytest.mark.parametrize("deepspeed", [False, True])
def test_megatron_train_iters_with_train_samples_stops(tmp_path, deepspeed):
    _stops(_megatron(tmp_path, "--train-samples 512000", deepspeed=deepspeed), "--train-iters with --train-samples",
           "expected iteration-based training", "stops at start")


# ---- Megatron: argparse choices
@pytest.mark.parametrize("value, meant", [("ful", "full"), ("Full", "full"), ("selectiv", "selective")])
def test_megatron_recompute_granularity_outside_its_choices_stops(tmp_path, value, meant):
    _stops(_megatron(tmp_path, f"--recompute-granularity {value}"), f"--recompute-granularity {value}",
           "full, selective", "refuse this value at start", f"did you mean {meant}?")


def test_megatron_recompute_granularity_in_its_choices_passes(tmp_path):
    res = _megatron(tmp_path, "--recompute-granularity selective")
    assert res.job is not None and res.job.layout.recompute == "selective", res.error


@pytest.mark.parametrize("value, meant, deepspeed", [("rotery", "rope", False), ("learned-absolute", "learned_absolute",
                                                                                 False),
                                                     ("Rope", "rope", False), ("rotery", "rotary", True)])
def test_megatron_position_embedding_type_outside_its_choices_stops(tmp_path, value, meant, deepspeed):
    _stops(_megatron(tmp_path, f"--position-embedding-type {value}", deepspeed=deepspeed),
           f"--position-embedding-type {value}", "refuse this value at start", f"did you mean {meant}?")


@pytest.mark.parametrize("value, pos", [("learned_absolute", "learned"), ("rope", "rotary"), ("none", "none")])
def test_megatron_position_embedding_types_pass(tmp_path, value, pos):
    _modelled(_megatron(tmp_path, f"--position-embedding-type {value}"), lambda j: j.model.pos_emb, pos,
              "--position-embedding-type")


def test_megatron_relative_positions_say_what_is_modelled(tmp_path):
    res = _megatron(tmp_path, "--position-embedding-type relative")
    _modelled(res, lambda j: j.model.pos_emb, "none")
    _warned(res, "--position-embedding-type relative", "modelled as none", "bias is not costed", "job.sbatch:6")


# ---- Megatron: --distribute-saved-activations (validate_args asserts tp > 1, full granularity, a method)
@pytest.mark.parametrize("extra, needs", [
    ("--tensor-model-parallel-size 1 --recompute-granularity full --recompute-method uniform",
     "--tensor-model-parallel-size above 1"),
    ("--recompute-granularity full --recompute-method uniform", "--tensor-model-parallel-size above 1"),
    ("--tensor-model-parallel-size 4 --recompute-granularity selective", "--recompute-granularity full"),
    ("--tensor-model-parallel-size 4 --recompute-granularity full", "a --recompute-method"),
])
def test_megatron_distribute_saved_activations_without_its_needs_stops(tmp_path, extra, needs):
    _stops(_megatron(tmp_path, f"{extra} --distribute-saved-activations"),
           "--distribute-saved-activations needs", needs, "validate_args asserts it", "stops at start")


def test_megatron_distribute_saved_activations_with_its_needs_partitions(tmp_path):
    res = _megatron(tmp_path, "--tensor-model-parallel-size 4 --recompute-granularity full --recompute-method uniform "
                              "--distribute-saved-activations")
    assert res.job is not None and res.job.layout.partition_activations, res.error
    # Releases that take --checkpoint-activations make it full granularity, uniform, before the assert.
    res = _megatron(tmp_path, "--tensor-model-parallel-size 4 --checkpoint-activations --distribute-saved-activations")
    assert res.job is not None and res.job.layout.partition_activations, res.error


# ---- Megatron-DeepSpeed: --glu-activation (bigscience's GLU_ACTIVATIONS)
@pytest.mark.parametrize("glu, gate", [("geglu", "GELU"), ("reglu", "ReLU"), ("liglu", "no function")])
def test_megatron_deepspeed_glu_activation_says_what_changes(tmp_path, glu, gate):
    res = _megatron(tmp_path, f"--glu-activation {glu}", deepspeed=True)
    assert res.job is not None, res.error
    # dense_h_to_4h gives 2 × ffn-hidden-size (4h by default): SwiGLU's shapes exactly
    assert res.job.model.activation == "swiglu" and res.job.model.ffn_hidden == 4 * 4096
    assert any(w.startswith(f"--glu-activation {glu} is modelled as swiglu (a gated MLP of the same shapes; {gate}")
               and "job.sbatch:6" in w for w in res.warnings), res.warnings


def test_megatron_deepspeed_misspelt_glu_activation_stops(tmp_path):
    _stops(_megatron(tmp_path, "--glu-activation swigul", deepspeed=True), "--glu-activation swigul",
           "geglu, liglu, reglu, swiglu", "did you mean swiglu?")


# ---- NeMo (Hydra overrides against NeMo's accepted values)
def _nemo(tmp_path, overrides: str):
    return parse_in(tmp_path, NEMO_HEAD + NEMO_LAUNCH + "model.ffn_hidden_size=8192 " + overrides + "\n",
                    {"conf/gpt.yaml": NEMO_CONF})


def _nemo_stops(res, key: str, *parts):
    assert res.job is None, res.warnings
    assert res.error.startswith(f"{key} ") or f": {key} " in res.error or key in res.error, res.error
    for part in parts:
        assert part in res.error, res.error
    assert res.error.endswith(f"job.sbatch:3 (override {key}))"), res.error


@pytest.mark.parametrize("name, meant", [("distributed_fused_adma", "distributed_fused_adam"),
                                         ("Distributed_Fused_Adam", "distributed_fused_adam"), ("adamW", "adamw")])
def test_nemo_misspelt_optimizer_stops(tmp_path, name, meant):
    _nemo_stops(_nemo(tmp_path, f"model.optim.name={name}"), "model.optim.name", f"'{name}'",
                "Cannot resolve optimizer", f"did you mean '{meant}'?")


def test_nemo_optimizer_name_is_not_judged_beside_a_target(tmp_path):
    """With model.optim._target_ NeMo instantiates that class and never looks the name up."""
    res = _nemo(tmp_path, "+model.optim._target_=apex.optimizers.FusedLAMB model.optim.name=my_lamb")
    assert res.job is not None, res.error


@pytest.mark.parametrize("name, zero", [("distributed_fused_adam", 1), ("mcore_distributed_optim", 1),
                                        ("fused_adam", 0), ("megatron_fused_adam", 0)])
def test_nemo_optimizers_shard_as_nemo_does(tmp_path, name, zero):
    res = _nemo(tmp_path, f"model.optim.name={name}")
    assert res.job is not None, res.error
    assert res.job.layout.zero_stage == zero


@pytest.mark.parametrize("value, meant", [("fulll", "full"), ("Full", "full"), ("selectve", "selective")])
def test_nemo_misspelt_checkpoint_granularity_stops(tmp_path, value, meant):
    _nemo_stops(_nemo(tmp_path, f"model.activations_checkpoint_granularity={value}"),
                "model.activations_checkpoint_granularity", "full, selective", "NeMo stops",
                f"did you mean '{meant}'?")


@pytest.mark.parametrize("value, recompute", [("full model.activations_checkpoint_method=uniform", "full"),
                                              ("selective", "selective"), ("null", "none")])
def test_nemo_checkpoint_granularities_pass(tmp_path, value, recompute):
    res = _nemo(tmp_path, f"model.activations_checkpoint_granularity={value}")
    assert res.job is not None and res.job.layout.recompute == recompute, res.error


def test_nemo_misspelt_normalization_under_mcore_stops(tmp_path):
    _nemo_stops(_nemo(tmp_path, "++model.mcore_gpt=true ++model.normalization=rmsnrom"), "model.normalization",
                "'rmsnrom'", "Megatron-core", "did you mean 'rmsnorm'?")


@pytest.mark.parametrize("norm, want", [("rmsnorm", "rmsnorm"), ("RMSNorm", "rmsnorm"), ("layernorm1p", "layernorm")])
def test_nemo_mcore_normalizations_pass(tmp_path, norm, want):
    _modelled(_nemo(tmp_path, f"++model.mcore_gpt=true ++model.normalization={norm}"), lambda j: j.model.norm,
              want, "normalization")


def test_nemo_legacy_model_builds_rmsnorm_for_an_unknown_norm(tmp_path):
    # NeMo's legacy (non-mcore) transformer: LayerNorm for three names, MixedFusedRMSNorm for any other
    res = _nemo(tmp_path, "++model.normalization=layernrom")
    _modelled(res, lambda j: j.model.norm, "rmsnorm")
    _warned(res, "model.normalization 'layernrom'", "builds RMSNorm", "did you mean 'layernorm'?", "job.sbatch:3")


@pytest.mark.parametrize("act, meant", [("swigul", "swiglu"), ("SwiGLU", "swiglu"), ("fast_swiglu", "fast-swiglu")])
def test_nemo_misspelt_activation_stops(tmp_path, act, meant):
    _nemo_stops(_nemo(tmp_path, f"model.activation={act}"), "model.activation", f"'{act}'", "activation_to_func",
                f"did you mean '{meant}'?")


@pytest.mark.parametrize("act, modelled, shape", [("geglu", "swiglu", "a gated MLP of the same shapes"),
                                                  ("fast-reglu", "swiglu", "a gated MLP of the same shapes"),
                                                  ("squared-relu", "gelu", "an ungated MLP of the same shapes")])
def test_nemo_known_activations_say_what_is_modelled(tmp_path, act, modelled, shape):
    res = _nemo(tmp_path, f"model.activation={act}")
    assert res.job is not None and res.job.model.activation == modelled, res.error
    assert any(w.startswith(f"activation {act} is modelled as {modelled} ({shape}") for w in res.warnings), \
        res.warnings


@pytest.mark.parametrize("act", ["gelu", "swiglu", "fast-swiglu"])
def test_nemo_activations_costed_as_written_say_nothing(tmp_path, act):
    _modelled(_nemo(tmp_path, f"model.activation={act}"), lambda j: j.model.activation,
              "gelu" if act == "gelu" else "swiglu", f"activation {act} ")


def test_nemo_unknown_position_embedding_is_warned_truthfully(tmp_path):
    # NeMo does not check the name: Megatron-core / NeMo's legacy Embedding build no position embedding
    res = _nemo(tmp_path, "++model.position_embedding_type=roep")
    _modelled(res, lambda j: j.model.pos_emb, "none")
    _warned(res, "model.position_embedding_type 'roep'", "builds no position embedding", "did you mean 'rope'?",
            "job.sbatch:3")


@pytest.mark.parametrize("pos, want", [("rope", "rotary"), ("learned_absolute", "learned"), ("alibi", "alibi")])
def test_nemo_position_embeddings_pass(tmp_path, pos, want):
    _modelled(_nemo(tmp_path, f"++model.position_embedding_type={pos}"), lambda j: j.model.pos_emb, want,
              "position_embedding_type")
