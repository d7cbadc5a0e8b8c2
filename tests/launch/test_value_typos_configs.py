"""No typo is silent, in config values: a GPT-NeoX, DeepSpeed, llm-foundry or TorchTitan value that
the framework refuses at start-up stops the prediction (with the key, its file:line and the nearest
accepted value); a value it accepts but perfcast models approximately is a true warning."""
from __future__ import annotations

import re

import pytest

from .conftest import DATA
from .helpers import parse_in
from .test_typos import MEGATRON, _megatron

# ------------------------------------------------------------------------------- GPT-NeoX
NEOX = """{
  "num_layers": 4,
  "hidden_size": 1024,
  "num_attention_heads": 16,
  "seq_length": 2048,
  "train_micro_batch_size_per_gpu": 4,
  "train_iters": 100,
  "pipe_parallel_size": 2,
  EXTRA
  "bf16": {"enabled": true}
}
"""
NEOX_LINE = 9          # the line of EXTRA above
NEOX_HEAD = "#!/bin/bash\n#SBATCH -N 1 --gpus-per-node=8\n"


def _neox(tmp_path, extra: str):
    return parse_in(tmp_path, NEOX_HEAD + "python deepy.py train.py m.yml\n",
                    {"m.yml": NEOX.replace("EXTRA", extra + ",")})


def _stops(res, *parts: str, line: str = f"m.yml:{NEOX_LINE})"):
    assert res.job is None, res.warnings
    for p in parts:
        assert p in res.error, res.error
    assert res.error.endswith(line), res.error
    assert "\n" not in res.error
    return res.error


@pytest.mark.parametrize("extra, meant", [
    ('"norm": "rmsnrom"', "'rmsnorm'"),
    ('"norm": "banana"', ""),
    ('"pos_emb": "rotery"', "'rotary'"),
    ('"pos_emb": "banana"', ""),
    ('"pos_emb": 5', ""),
    ('"pos-emb": "alibbi"', "'alibi'"),
    ('"precision": "bfloat61"', "'bfloat16'"),
])
def test_neox_norm_pos_emb_precision_outside_their_choices_stop(tmp_path, extra, meant):
    err = _stops(_neox(tmp_path, extra), "NeoXArgs.validate_types", "stops at start")
    key = extra.split('"')[1].replace("-", "_")
    assert err.startswith(f"cannot predict: {key} "), err
    assert (f"did you mean {meant}?" in err) if meant else "did you mean" not in err


@pytest.mark.parametrize("extra, want", [
    ('"norm": "rmsnorm"', ("rmsnorm", "learned")),
    ('"norm": "te_rmsnorm"', ("rmsnorm", "learned")),
    ('"norm": "LayerNorm"', None),          # any case passes NeoX's check, but get_norm compares exactly
    ('"pos_emb": "alibi"', ("layernorm", "alibi")),
    ('"pos_emb": "rpe"', ("layernorm", "none")),
])
def test_neox_known_norms_and_embeddings(tmp_path, extra, want):
    res = _neox(tmp_path, extra)
    if want is None:
        _stops(res, "get_norm compares 'layernorm' exactly", "did you mean 'layernorm'?")
        return
    assert res.error is None, res.error
    assert (res.job.model.norm, res.job.model.pos_emb) == want


def test_neox_pos_emb_in_another_case_is_warned_as_none(tmp_path):
    res = _neox(tmp_path, '"pos_emb": "Rotary"')
    assert res.error is None, res.error
    assert res.job.model.pos_emb == "none"
    assert any("pos_emb 'Rotary'" in w and "no position embedding" in w and f"m.yml:{NEOX_LINE}" in w
               for w in res.warnings), res.warnings


def test_neox_scalenorm_and_non_parametric_layernorm_are_warned(tmp_path):
    for norm in ("scalenorm", "non_parametric_layernorm"):
        res = _neox(tmp_path, f'"norm": "{norm}"')
        assert res.job.model.norm == "layernorm"
        assert any(f"norm: {norm}" in w and "modelled as layernorm" in w for w in res.warnings), res.warnings


def test_neox_misspelt_activation_stops(tmp_path):
    _stops(_neox(tmp_path, '"activation": "swigul"'), "activation 'swigul' is not one of", "stops at start",
           "did you mean 'swiglu'?")
    _stops(_neox(tmp_path, '"activation": "SwiGLU"'), "get_activation", "did you mean 'swiglu'?")


@pytest.mark.parametrize("act, modelled, warned", [
    ("relu", "gelu", "modelled as gelu (an ungated MLP of the same shapes)"),
    ("geglu", "swiglu", "modelled as swiglu (a gated MLP of the same shapes)"),
    ("swiglu", "swiglu", None),
    ("gelu", "gelu", None),
])
def test_neox_known_activations_say_what_is_modelled(tmp_path, act, modelled, warned):
    res = _neox(tmp_path, f'"activation": "{act}"')
    assert res.error is None, res.error
    assert res.job.model.activation == modelled
    got = [w for w in res.warnings if w.startswith(f"activation {act}")]
    assert (any(warned in w for w in got) if warned else not got), res.warnings
    # a gated activation changes the MLP's width (NeoX's ParallelMLP: 2/3 of 4h, halved per branch)
    assert res.job.model.ffn_hidden == (int(4 * 1024 * 2 / 3) // 2 if modelled == "swiglu" else 4096)


def test_neox_misspelt_attention_type_stops(tmp_path):
    _stops(_neox(tmp_path, '"attention_config": [[["flahs"], "all"]]'),
           "attention_config type 'flahs' is not one of", "stops at start", "did you mean 'flash'?")
    _stops(_neox(tmp_path, '"attention_config": [[["global", "loacl"], 2]]'), "did you mean 'local'?")


def test_neox_known_attention_types_are_warned_truthfully(tmp_path):
    res = _neox(tmp_path, '"attention_config": [[["local"], "all"]]')
    assert res.error is None, res.error
    assert any("attention type local is modelled as global attention" in w and "upper bound" in w
               for w in res.warnings), res.warnings
    res = _neox(tmp_path, '"attention_config": [[["flash"], "all"]]')
    assert res.job.model.attention == "flash" and not [w for w in res.warnings if "attention type" in w]


@pytest.mark.parametrize("method, parts", [
    ("type:transfomer", ("found no valid layers to partition", "did you mean 'type:transformer'?")),
    ("type:attention", ("found no valid layers to partition",)),
    ("profile", ("NotImplementedError",)),
    ("unifrom", ("NotImplementedError", "did you mean 'uniform'?")),
])
def test_neox_pipe_partition_method_deepspeed_refuses_stops(tmp_path, method, parts):
    _stops(_neox(tmp_path, f'"pipe_partition_method": "{method}"'), f"pipe_partition_method '{method}'",
           "stops at start", *parts)


def test_neox_zero_stage_as_text_stops(tmp_path):
    yml = NEOX.replace("EXTRA", '"zero_optimization": {"stage": "one"},')
    res = parse_in(tmp_path, NEOX_HEAD + "python deepy.py train.py m.yml\n", {"m.yml": yml})
    _stops(res, "zero_optimization.stage 'one'", "0, 1, 2 or 3", "did you mean 1?")


# ------------------------------------------------------------------------------- DeepSpeed JSON
def _ds(tmp_path, text: str):
    (tmp_path / "ds.json").write_text(text)
    return _megatron(tmp_path, f"--deepspeed --deepspeed_config {tmp_path / 'ds.json'}")


@pytest.mark.parametrize("text, what", [("", "is empty"), ("  \n\n", "is empty"), ("[1, 2, 3]", "is a JSON list"),
                                        ("null", "is null"), ("7", "is a JSON int")])
def test_deepspeed_config_that_is_no_object_stops(tmp_path, text, what):
    res = _ds(tmp_path, text)
    assert res.job is None, res.warnings
    assert what in res.error and "DeepSpeed stops at start" in res.error, res.error
    assert res.error.endswith("ds.json:1)"), res.error


@pytest.mark.parametrize("stage, hint", [('"one"', " (did you mean 1?)"), ('"ZeRO-2"', ""), ("1.5", "")])
def test_deepspeed_zero_stage_that_is_no_integer_stops(tmp_path, stage, hint):
    res = _ds(tmp_path, '{"train_batch_size": 512,\n "zero_optimization": {\n  "stage": %s\n }\n}' % stage)
    assert res.job is None, res.warnings
    assert "zero_optimization.stage" in res.error and "is not a ZeRO stage (0, 1, 2 or 3)" in res.error
    assert "stops at start" in res.error and hint in res.error
    assert ("did you mean" in res.error) == bool(hint), res.error
    assert res.error.endswith("ds.json:3)"), res.error


@pytest.mark.parametrize("key", ["train_micro_batch_size_per_gpu", "train_batch_size", "gradient_accumulation_steps"])
def test_deepspeed_batch_size_that_is_a_word_stops(tmp_path, key):
    # DeepSpeedConfig's batch check compares each with 0: a word raises TypeError at start
    res = _ds(tmp_path, '{"zero_optimization": {"stage": 1},\n "%s": "eight"\n}' % key)
    assert res.job is None, res.warnings
    assert f"{key} is 'eight'" in res.error and "DeepSpeed stops at start" in res.error, res.error
    assert res.error.endswith("ds.json:2)"), res.error
    # a template's bare word (filled by sed before the run) and HF's "auto" stay unknown
    for value in ("MICRO_BATCH", '"auto"', '"4"'):
        res = _ds(tmp_path, '{"zero_optimization": {"stage": 1}, "%s": %s}' % (key, value))
        assert res.job is not None, res.error


@pytest.mark.parametrize("value, said", [("99999999999999999999999", "too large for any job"),
                                         ("2.5", "not a whole number"), ("[4]", "not a number")])
def test_deepspeed_batch_size_that_is_no_usable_number_is_warned_as_what_it_is(tmp_path, value, said):
    res = _ds(tmp_path, '{"zero_optimization": {"stage": 1},\n "train_micro_batch_size_per_gpu": %s\n}' % value)
    assert res.job is not None, res.error
    assert any(w.startswith("train_micro_batch_size_per_gpu is ") and f", {said} (" in w and "ds.json:2)" in w
               for w in res.warnings), res.warnings


def test_deepspeed_null_batch_size_is_not_given(tmp_path):
    # DeepSpeed reads the sizes with get(): null is derived from the other two, as if absent
    res = _ds(tmp_path, '{"zero_optimization": {"stage": 1}, "train_batch_size": null, '
                        '"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2}')
    assert res.job is not None and not [w for w in res.warnings if "train_batch_size" in w], (res.error, res.warnings)


def test_deepspeed_batch_size_word_in_a_written_config_is_named_where_written(tmp_path):
    written = ("cat > ds.json <<EOF\n{\n"
               '  "train_micro_batch_size_per_gpu": "eight",\n  "zero_optimization": {"stage": 1}\n}\nEOF\n')
    script = MEGATRON.format(extra="--deepspeed --deepspeed_config ds.json").replace("srun ", written + "srun ", 1)
    res = parse_in(tmp_path, script)
    assert res.job is None and "train_micro_batch_size_per_gpu is 'eight'" in res.error, res.error
    assert res.error.endswith("job.sbatch:5)"), res.error


def test_deepspeed_zero_stage_template_placeholder_stays_unknown(tmp_path):
    # a sed template's bare word (filled before the run) and HF's "auto" are not judged
    for stage in ("ZERO_STAGE", '"auto"', '"2"'):
        res = _ds(tmp_path, '{"train_batch_size": 512, "zero_optimization": {"stage": %s}}' % stage)
        assert res.job is not None, res.error


# ------------------------------------------------------------------------------- llm-foundry
MPT1B = (DATA / "llmfoundry" / "mpt-1b-gqa.yaml").read_text()
FOUNDRY = "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8\n" \
          "srun composer --world_size 16 -n 8 scripts/train/train.py mpt.yaml\n"


def _foundry(tmp_path, old: str, new: str):
    assert old in MPT1B
    return parse_in(tmp_path, FOUNDRY, {"mpt.yaml": MPT1B.replace(old, new)})


@pytest.mark.parametrize("old, new, line, meant", [
    ("ffn_type: mptglu", "ffn_type: mptgl", 25, "'mptglu'"),
    ("ffn_type: mptglu", "ffn_type: MPTGLU", 25, "'mptglu'"),
    ("attn_type: grouped_query_attention", "attn_type: grouped_query_atention", 20, "'grouped_query_attention'"),
])
def test_llmfoundry_misspelt_registry_names_stop(tmp_path, old, new, line, meant):
    res = _foundry(tmp_path, old, new)
    assert res.job is None, res.warnings
    assert "not one of" in res.error and "registry" in res.error and "stops" in res.error
    assert f"did you mean {meant}?" in res.error and res.error.endswith(f"mpt.yaml:{line})"), res.error


@pytest.mark.parametrize("old, new, what", [
    ("ffn_type: mptglu", "ffn_type: my_plugin_ffn", "modelled as mptmlp"),
    ("attn_type: grouped_query_attention", "attn_type: my_plugin_attention", "modelled as multihead_attention"),
])
def test_llmfoundry_plugin_names_are_warned_truthfully(tmp_path, old, new, what):
    res = _foundry(tmp_path, old, new)
    assert res.job is not None, res.error
    name = new.split(": ")[1]
    got = [w for w in res.warnings if f"'{name}'" in w]
    assert got and "stops at start unless a plugin registers it" in got[0] and what in got[0], res.warnings


def test_llmfoundry_torch_dmoe_is_mixture_of_experts(tmp_path):
    res = _foundry(tmp_path, "ffn_type: mptglu", "ffn_type: torch_dmoe")
    assert res.job is None and "mixture-of-experts" in res.error, res.error


# ------------------------------------------------------------------------------- TorchTitan
TITAN = """[model]
name = "llama3"
flavor = "8B"

[training]
local_batch_size = 1
seq_len = 8192
steps = 100

[activation_checkpoint]
mode = "MODE"
"""
TITAN_LAUNCH = ("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8\n"
                "srun torchrun --nnodes 2 --nproc_per_node 8 -m torchtitan.train --job.config_file cfg.toml\n")


def _titan(tmp_path, mode: str, extra: str = ""):
    return parse_in(tmp_path, TITAN_LAUNCH, {"cfg.toml": TITAN.replace("MODE", mode) + extra})


@pytest.mark.parametrize("mode, meant", [("selectiv", "'selective'"), ("Full", "'full'"), ("off", "")])
def test_torchtitan_ac_mode_outside_its_choices_stops(tmp_path, mode, meant):
    res = _titan(tmp_path, mode)
    assert res.job is None, res.warnings
    assert f"activation_checkpoint.mode '{mode}' is not one of" in res.error and "Invalid AC mode" in res.error
    assert (f"did you mean {meant}?" in res.error) if meant else "did you mean" not in res.error
    assert res.error.endswith("cfg.toml:11)"), res.error


def test_torchtitan_selective_ac_option_it_refuses_stops(tmp_path):
    res = _titan(tmp_path, "selective", 'selective_ac_option = "opp"\n')
    assert res.job is None and "Invalid selective AC option" in res.error, res.warnings
    assert "did you mean 'op'?" in res.error and res.error.endswith("cfg.toml:12)"), res.error


@pytest.mark.parametrize("mode, want", [("none", "none"), ("full", "full"), ("selective", "selective"),
                                        ("memory_budget", "selective")])
def test_torchtitan_known_ac_modes(tmp_path, mode, want):
    res = _titan(tmp_path, mode)
    assert res.error is None, res.error
    assert res.job.layout.recompute == want
    warned = [w for w in res.warnings if "memory_budget" in w]
    assert bool(warned) == (mode == "memory_budget"), res.warnings
    assert not re.search(r"modelled as selective$", " ".join(res.warnings))


def test_values_unknown_in_the_script_stay_unknown(tmp_path):
    # a value the script computes is not judged: it is unknown, and said so
    script = NEOX_HEAD + ('V=$(make_value)\ncat > m.yml <<EOT\n'
                          '{"num_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "seq_length": 64,\n'
                          ' "train_micro_batch_size_per_gpu": 1, "train_iters": 1, "norm": "$V", "pos_emb": "$V",\n'
                          ' "activation": "$V", "pipe_partition_method": "$V", "zero_optimization": {"stage": $V}}\n'
                          'EOT\npython deepy.py train.py m.yml\n')
    res = parse_in(tmp_path, script)
    assert res.error is None, res.error
    for key in ("model.norm", "model.pos_emb", "model.activation", "model.ffn_hidden", "layout.zero_stage",
                "layout.pipe_split"):
        assert key in res.unresolved, res.unresolved
    script = ("#!/bin/bash\n#SBATCH -N 1 --gpus-per-node=8\nCFG=$(make_config)\ncat > ds.json <<EOT\n$CFG\nEOT\n"
              "deepspeed pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 64 "
              "--micro-batch-size 1 --global-batch-size 8 --train-iters 10 --deepspeed --deepspeed_config ds.json\n")
    res = parse_in(tmp_path, script)
    assert res.error is None, res.error
    assert any("ds.json is unknown" in w and "its keys are not read" in w for w in res.warnings), res.warnings


def test_neox_attention_config_already_expanded_and_zero_count_entries_are_not_refused(tmp_path):
    """NeoX's expand_attention_types takes a list of strings as already expanded (one type per
    layer), and an entry of count 0 expands to no layer, so its type is never checked."""
    res = _neox(tmp_path, '"attention_config": ["global", "global", "flash", "flash"]')
    assert res.job is not None, res.error
    res = _neox(tmp_path, '"attention_config": [[["flahs"], 0], [["global"], "all"]]')
    assert res.job is not None, res.error
    _stops(_neox(tmp_path, '"attention_config": ["global", "flahs"]'), "did you mean 'flash'?")
