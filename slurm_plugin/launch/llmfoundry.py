"""MosaicML llm-foundry launches -> facts: ``composer scripts/train/train.py X.yaml [key=value …]``.

The YAML is an OmegaConf config: ``${variables.x}`` / ``${x}`` interpolations are followed, and the
dotted ``key=value`` overrides after it win (OmegaConf merges them into the file).  The model is MPT
(``model.name: mpt_causal_lm``); a Hugging Face model (``hf_causal_lm``) takes its shape from a
checkpoint this reader does not open and is refused.  Data parallelism is Composer's PyTorch FSDP
(FSDP1, one unit per MPT block): ``fsdp_config.sharding_strategy`` FULL_SHARD is ZeRO-3,
SHARD_GRAD_OP ZeRO-2 (which FSDP1 gathers and reduce-scatters block by block every micro-batch:
``predictor.recipe.gathers_layers``), NO_SHARD (or no ``fsdp_config``) DDP, HYBRID_SHARD ZeRO-3
sharded within each node (``layout.dp_shard``), a replicate degree (or _HYBRID_SHARD_ZERO2 on a
two-dimensional mesh) ZeRO-2 or 3 sharded within the groups.  The keys and their sources are in
:mod:`.llmfoundry_keys`; docs/launch-formats.md says what each becomes.
"""
from __future__ import annotations

import math
import re
from typing import Any, Optional

import yaml

from . import moe
from .configs import Config, check_duplicates, to_bool, to_int
from .facts import Facts
from .limits import MAX_KEY_SUGGESTIONS, CannotPredict
from .llmfoundry_keys import (ATTN_CONFIG_KEYS, FFN_CONFIG_KEYS, FSDP_CONFIG_KEYS, MPT_MODEL_KEYS, READ_KEYS,
                              TRAIN_CONFIG_KEYS)
from .nemo import HydraArgs, View
from .neox_keys import refuse_choice, suggest
from .values import MARK_OPEN, Tok

FRAMEWORK = "llm-foundry"
TRAIN_SCRIPTS = ("train.py",)
# MPTConfig's defaults (configuration_mpt.py), used where the model section leaves a key out
_MPT_DEFAULTS = {"d_model": 2048, "n_heads": 16, "n_layers": 24, "expansion_ratio": 4, "max_seq_len": 2048,
                 "vocab_size": 50368}
# attn_config_defaults' attn_impl (llmfoundry/models/utils/config_defaults.py); earlier releases'
# MPT configs defaulted to "triton" (and "torch"): a config that relies on the default gets the
# current one, said in its provenance.
DEFAULT_ATTN_IMPL = "flash"
_DURATION = re.compile(r"\s*(\d[\d_]*)\s*(ba|tok|sp|ep|dur)?\s*")
_ZERO = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "NO_SHARD": 0, "HYBRID_SHARD": 3, "_HYBRID_SHARD_ZERO2": 2}
# Composer's FSDP mixed_precision (composer/distributed/mosaic_parallelism.py, get_mixed_precision):
# DEFAULT reduces gradients in fp32, PURE in the autocast dtype ("" here), FULL keeps everything in
# fp32; a mapping names reduce_dtype itself, in the spellings of _DTYPES
_REDUCE = {"DEFAULT": "fp32", "PURE": "", "FULL": "fp32"}
_DTYPES = {"fp32": ("float32", "torch.float32", "fp32"),
           "fp16": ("float16", "torch.float16", "half", "fp16", "amp", "amp_fp16"),
           "bf16": ("bfloat16", "bfloat", "torch.bfloat16", "bf16", "amp_bf16", "amp_fp8")}


def is_llmfoundry(launcher: str, module: Optional[str], script: Tok, args: list) -> bool:
    """Composer's launcher, llm-foundry's module, or ``…/train.py X.yaml`` (its first argument a YAML)."""
    if launcher == "composer" or (module or "").split(".")[0] in ("llmfoundry", "composer"):
        return True
    base = script.text.rsplit("/", 1)[-1]
    return base in TRAIN_SCRIPTS and bool(args) and bool(re.search(r"\.ya?ml$", args[0].text))


def read_cli(args: list, warnings: list) -> tuple[Optional[Tok], HydraArgs]:
    """(the YAML token, the ``key=value`` overrides as OmegaConf's dot-list reads them)."""
    h = HydraArgs()
    cfg: Optional[Tok] = None
    for a in args:
        t = a.text
        if cfg is None and not t.startswith("-") and "=" not in t:
            cfg = a
            continue
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_.\-]*)=(.*)", t, re.S)
        if m is None:
            if MARK_OPEN in t:
                h.unknown = t
            else:
                warnings.append(f"{t[:60]!r} is not a key=value override (llm-foundry hands every argument "
                                f"after the YAML to OmegaConf.from_cli); ignored ({a.origin_at(0)})")
            continue
        key, val = m.group(1), m.group(2)
        h.overrides[key] = (_scalar(val), a.origin_at(len(key) + 1))
        h.prefixes[key] = ""
    return cfg, h


def _scalar(text: str) -> Any:
    """An override's value as OmegaConf reads it: YAML (``4`` an int, ``2.5`` a float, ``true`` a bool)."""
    if MARK_OPEN in text or len(text) > 1000:
        return text
    try:
        value = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, ValueError):
        return text
    return value if isinstance(value, (str, int, float, bool, list)) or value is None else text


# ---------------------------------------------------------------------------------------- key checks
def _section(v: View, dotted: str) -> dict:
    value, _o, found = v.get(dotted)
    return value if found and isinstance(value, dict) else {}


def check_keys(cfg: Config, h: HydraArgs, warnings: list) -> None:
    """Every key llm-foundry or Composer reads against its own list.  An unknown top-level key stops
    the job at start (llm-foundry's "Unused parameter"), unless the config has no ``variables:``
    section (written for an earlier release, which warned) and the key is close to none the reader
    uses: then it is a warning.  Elsewhere unknown keys are kept silently by
    MPTConfig / FSDPConfig, so a likely misspelling of a key this reader uses stops the prediction
    (the job would train another model or layout) and any other is a warning."""
    v = View(cfg, h)
    data = cfg.data if isinstance(cfg.data, dict) else {}
    scopes = [("", TRAIN_CONFIG_KEYS, ()), ("model", MPT_MODEL_KEYS, ("model",)),
              ("attn_config", ATTN_CONFIG_KEYS, ("model", "attn_config")),
              ("ffn_config", FFN_CONFIG_KEYS, ("model", "ffn_config")),
              ("fsdp_config", FSDP_CONFIG_KEYS, ("fsdp_config",))]
    looked = 0
    for name, known, path in scopes:
        block = data if not path else _section(v, ".".join(path))
        given = [(k, cfg.key_origin(path + (k,))) for k in block if isinstance(k, str)]
        prefix = ".".join(path) + "." if path else ""
        given += [(key[len(prefix):], origin) for key, (_val, origin) in h.overrides.items()
                  if key.startswith(prefix) and "." not in key[len(prefix):]]
        if not path:
            # a dotted override adds its first part at the top level when the file lacks it
            given += [(key.split(".")[0], origin) for key, (_val, origin) in h.overrides.items()
                      if "." in key and key.split(".")[0] not in block]
        for key, origin in given:
            if key in known:
                continue
            looked += 1
            if looked > MAX_KEY_SUGGESTIONS:
                continue
            guess = suggest(key, known)
            shown = prefix + key
            near = f"; did you mean {prefix}{guess}?" if guess else ""
            if not path:
                why = (f"{key} is not an llm-foundry config key: llm-foundry stops at start (\"Unused parameter "
                       f"{key} found in cfg\"; put variables under variables:){near}")
                if "variables" in data or (guess is not None and guess in READ_KEYS[""]):
                    raise CannotPredict(why, origin)
                # no variables: section: written for a release before TrainConfig, which only warned
                warnings.append(f"{why} — releases before its TrainConfig only warned ({origin})")
                continue
            if guess is not None and guess in READ_KEYS[name]:
                raise CannotPredict(f"{shown} is not an llm-foundry {name} key and would be ignored{near} "
                                    f"(without it the job would be a different one)", origin)
            warnings.append(f"{shown} is not an llm-foundry {name} key and is ignored ({origin}){near}")
    if looked > MAX_KEY_SUGGESTIONS:
        warnings.append(f"{cfg.label}: {looked - MAX_KEY_SUGGESTIONS} more keys that are not llm-foundry keys")


# ---------------------------------------------------------------------------------------- values
def _value(v: View, dotted: str) -> tuple[Any, str, bool]:
    raw, raw_origin, raw_found = v.raw(dotted)
    value, origin, found = v.get(dotted)
    if raw_found and not found:
        raise CannotPredict(f"{dotted}: {str(raw)[:60]} cannot be resolved (no such key, or a loop); OmegaConf "
                            f"stops at start with an interpolation error", raw_origin)
    if found and isinstance(value, str) and "${" in value:
        # a resolver (${oc.env:X}) or an interpolation inside a longer string
        return _Unknown(f"{dotted} is {value[:60]!r}, an OmegaConf expression resolved when the job runs"), \
            origin, True
    return value, origin, found


class _Unknown(str):
    """A value only known when the job runs (its reason is the text)."""


def _int(f: Facts, v: View, dotted: str, fact: str, default: Optional[int] = None, why: str = "") -> None:
    value, origin, found = _value(v, dotted)
    if not found or value is None:
        if default is not None:
            f.set(fact, default, why or f"MPTConfig default ({dotted.split('.')[-1]} {default})")
        return
    if isinstance(value, _Unknown):
        f.set_unknown(fact, str(value), origin)
        return
    f.set_int_value(fact, value, origin, what=dotted)


def _str(v: View, dotted: str, default: str = "") -> tuple[str, str, bool]:
    value, origin, found = _value(v, dotted)
    if not found or value is None or isinstance(value, _Unknown) or (isinstance(value, str) and MARK_OPEN in value):
        return default, origin, False
    return str(value), origin, True


def _bool(v: View, dotted: str, default: bool) -> tuple[bool, str, bool]:
    value, origin, found = _value(v, dotted)
    b = to_bool(value) if found else None
    return (default if b is None else b), origin, b is not None


def duration(text: Any, what: str, origin: str) -> tuple[int, str]:
    """(count, unit) of a Composer time string (``63900ba``, ``134e9tok`` is refused: Composer
    wants digits); an integer is epochs, as Composer reads it."""
    if isinstance(text, bool):
        raise CannotPredict(f"{what} {text!r} is not a duration", origin)
    if isinstance(text, int):
        return text, "ep"
    m = _DURATION.fullmatch(str(text))
    if not m:
        raise CannotPredict(f"{what} {str(text)[:40]!r} is not a Composer duration (N followed by ba, tok, sp "
                            f"or ep)", origin)
    return int(m.group(1).replace("_", "")), m.group(2) or "ep"


# ---------------------------------------------------------------------------------------- the reader
def read(cfg: Config, h: HydraArgs, f: Facts, world: Optional[int], world_origin: str,
         gpus_per_node: Optional[int]) -> None:
    """Fill facts (framework "llm-foundry"); ``world`` = the ranks the launcher starts (None = unknown)."""
    if not isinstance(cfg.data, dict):
        raise CannotPredict(f"{cfg.label} is not a mapping of llm-foundry config keys", cfg.label)
    if cfg.duplicates:     # om.load's YAML loader refuses a mapping with a key twice
        check_duplicates(cfg, "OmegaConf (llm-foundry's om.load)", True, f.warnings)
    v = View(cfg, h)
    w = f.warnings
    for dotted in ("model", "model.attn_config", "model.ffn_config", "fsdp_config", "variables"):
        value, origin, found = v.get(dotted)
        if found and value is not None and not isinstance(value, dict):
            raise CannotPredict(f"{dotted} is {type(value).__name__} {str(value)[:40]!r}, not a mapping of keys "
                                f"(llm-foundry stops at start)", origin)
    check_keys(cfg, h, w)
    _model(v, f, cfg.label)
    if _section(v, "tp_config"):
        raise CannotPredict("llm-foundry tp_config (tensor parallelism) is not read yet; describe the job in a "
                            "TOML job file (docs/job-file.md)", v.get("tp_config")[1])
    for k in ("tp", "pp", "cp"):
        f.set(k, 1, "llm-foundry (data parallel only)")
    _layout(v, f, world, world_origin, gpus_per_node)
    _batch(v, f, world, world_origin)
    _run(v, f)
    f.set("pipe_split", "megatron", "llm-foundry (no pipeline)")
    if h.unknown is not None:
        f.hidden_args = f.u.reason(h.unknown) or "unknown"


def _model(v: View, f: Facts, label: str) -> None:
    name, n_origin, found = _str(v, "model.name")
    if not found:
        raise CannotPredict("model.name not found (llm-foundry needs it; MPT is mpt_causal_lm)", n_origin or label)
    if name == "hf_causal_lm":
        raise CannotPredict("llm-foundry model hf_causal_lm takes its shape from a Hugging Face checkpoint "
                            "(pretrained_model_name_or_path) that perfcast does not open; describe the job in a "
                            "TOML job file (docs/job-file.md)", n_origin)
    if name != "mpt_causal_lm":
        raise CannotPredict(f"llm-foundry model {name!r} is not read (the reader knows mpt_causal_lm)", n_origin)
    ffn_type, ft_origin, _ = _str(v, "model.ffn_config.ffn_type", "mptmlp")
    ne, ne_origin, ne_found = _value(v, "model.ffn_config.moe_num_experts")
    if ffn_type in MOE_FFN_TYPES:
        moe.refuse(f"model.ffn_config.ffn_type {ffn_type}", ft_origin)
    if ne_found:
        moe.check_count(ne, "model.ffn_config.moe_num_experts", ne_origin)
    for key, fact in (("n_layers", "layers"), ("d_model", "hidden"), ("n_heads", "heads"),
                      ("vocab_size", "vocab")):
        _int(f, v, f"model.{key}", fact, _MPT_DEFAULTS[key])
    # the length trained on is the data's (the top-level max_seq_len llm-foundry requires)
    _int(f, v, "max_seq_len", "seq_len")
    if f.get("seq_len") is None:
        _int(f, v, "model.max_seq_len", "seq_len", _MPT_DEFAULTS["max_seq_len"])
    _ffn(v, f, ffn_type, ft_origin)
    _attention(v, f)
    norm, origin, found = _str(v, "model.norm_type", "low_precision_layernorm")
    if found and norm.lower() not in NORM_TYPES:
        _unknown_norm(norm, origin, f)
    f.set("norm", "rmsnorm" if "rms" in norm.lower() else "layernorm",
          origin if found else "MPTConfig default (low_precision_layernorm)")
    tied, origin, found = _bool(v, "model.tie_word_embeddings", True)
    f.set("tied_embeddings", tied, origin if found else "MPTConfig default (tie_word_embeddings)")
    # MPT's no_bias drops the biases of every linear layer (and norm); MPTConfig's default keeps them.
    no_bias, origin, found = _bool(v, "model.no_bias", False)
    f.set("linear_bias", not no_bias, origin if found else "MPTConfig default (no_bias false)")
    f.set("parallel_residual", False, "MPT block (sequential)")


# llm-foundry's norm registry (llmfoundry/models/layers/norm.py); MPT looks up norm_type.lower()
NORM_TYPES = frozenset(("layernorm", "low_precision_layernorm", "rmsnorm", "low_precision_rmsnorm",
                        "triton_rmsnorm"))


# llm-foundry's ffn registries (llmfoundry/models/layers/ffn.py: ``ffns``, ``ffns_with_norm``,
# ``ffns_with_megablocks``) and attention registry (layers/attention.py ``attention_classes``; in
# releases before the registries, FFN_CLASS_REGISTRY / ATTN_CLASS_REGISTRY with the same names).
# Building the model looks the name up exactly and fails at start on another one, unless a plugin
# registers it (the ``llmfoundry_ffns`` / ``llmfoundry_attention_classes`` entry points).
MOE_FFN_TYPES = ("torch_dmoe", "mb_moe", "mb_dmoe")
FFN_TYPES = ("mptmlp", "mptglu", "te_ln_mlp") + MOE_FFN_TYPES
ATTN_TYPES = ("multihead_attention", "multiquery_attention", "grouped_query_attention")


def _unregistered(key: str, name: str, registered: tuple, modelled: str, origin: str, f: Facts) -> None:
    """A name outside llm-foundry's registry: a likely misspelling of a registered one stops the
    prediction (llm-foundry stops at start: no plugin registers a near miss of its own names);
    another name may be a plugin's, and is a warning that says what the job needs and what is costed."""
    if suggest(name, frozenset(registered)) is not None or suggest(name.lower(), frozenset(registered)) is not None:
        refuse_choice(key, name, registered, "llm-foundry finds no such name in its registry and stops building the "
                      "model at start", origin)
    f.warnings.append(f"{key} {name!r} is not in llm-foundry's registry ({', '.join(registered)}): llm-foundry stops "
                      f"at start unless a plugin registers it; if one does, it is modelled as {modelled} ({origin})")


def _unknown_norm(norm: str, origin: str, f: Facts) -> None:
    """A norm_type outside the registry: a likely misspelling stops (building the model fails at
    start); another name may be a plugin's own registration, so it is a warning."""
    guess = suggest(norm.lower(), NORM_TYPES)
    names = ", ".join(sorted(NORM_TYPES))
    if guess is not None:
        raise CannotPredict(f"model.norm_type {norm!r} is not in llm-foundry's norm registry ({names}): "
                            f"llm-foundry stops building the model at start; did you mean {guess}?", origin)
    f.warnings.append(f"model.norm_type {norm!r} is not in llm-foundry's norm registry ({names}): llm-foundry "
                      f"stops at start unless a plugin registers it; modelled as "
                      f"{'rmsnorm' if 'rms' in norm.lower() else 'layernorm'} ({origin})")


def _ffn(v: View, f: Facts, ffn_type: str, ft_origin: str) -> None:
    if ffn_type not in FFN_TYPES:
        _unregistered("model.ffn_config.ffn_type", ffn_type, FFN_TYPES,
                      "mptmlp (a GeLU MLP of expansion_ratio × d_model; the plugin's own shapes are not known)",
                      ft_origin, f)
    f.set("activation", "swiglu" if ffn_type == "mptglu" else "gelu", ft_origin or "MPTConfig default (mptmlp)")
    size, s_origin, found = _value(v, "model.ffn_config.ffn_hidden_size")
    if found and size is not None:
        f.set_int_value("ffn_hidden", size, s_origin, what="model.ffn_config.ffn_hidden_size")
        return
    ratio, r_origin, r_found = _value(v, "model.expansion_ratio")
    if not r_found or ratio is None:
        ratio, r_origin = _MPT_DEFAULTS["expansion_ratio"], "MPTConfig default (expansion_ratio 4)"
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio < 1e6:
        raise CannotPredict(f"model.expansion_ratio {str(ratio)[:60]!r} is not a positive number "
                            f"(MPT multiplies d_model by it)", r_origin)
    if f.known("hidden"):
        # MPT's MLP: int(expansion_ratio × d_model), also for the gated one
        f.set("ffn_hidden", int(ratio * f.val("hidden")), r_origin)


def _attention(v: View, f: Facts) -> None:
    impl, origin, found = _str(v, "model.attn_config.attn_impl", DEFAULT_ATTN_IMPL)
    if not found:
        origin = f"llm-foundry default (attn_impl {DEFAULT_ATTN_IMPL})"
    if impl == "torch":
        # llm-foundry's own attention: q·kᵀ, softmax and ·v as separate operations, scores in memory
        f.set("attention", "unfused", origin)
    elif impl in ("flash", "triton"):
        f.set("attention", "flash", origin)
        # flash: the flash_attn package's FlashAttention-2; triton: llm-foundry's Triton kernel
        f.set("attention_impl", "flash2" if impl == "flash" else "triton", origin)
    else:
        raise CannotPredict(f"model.attn_config.attn_impl {impl!r} is not torch, flash or triton "
                            f"(MPTConfig refuses it)", origin)
    _sliding_window(v, f, impl, origin)
    kind, k_origin, _ = _str(v, "model.attn_config.attn_type", "multihead_attention")
    if kind == "multiquery_attention":
        f.set("kv_heads", 1, k_origin)
    elif kind == "grouped_query_attention":
        _int(f, v, "model.attn_config.kv_n_heads", "kv_heads")
        if f.get("kv_heads") is None:
            raise CannotPredict("grouped_query_attention without model.attn_config.kv_n_heads", k_origin)
    elif kind != "multihead_attention":
        _unregistered("model.attn_config.attn_type", kind, ATTN_TYPES,
                      "multihead_attention (n_heads key/value heads; the plugin's own shapes are not known)",
                      k_origin, f)
    alibi, a_origin, _ = _bool(v, "model.attn_config.alibi", False)
    rope, r_origin, _ = _bool(v, "model.attn_config.rope", False)
    learned, l_origin, l_found = _bool(v, "model.learned_pos_emb", True)
    if alibi:
        f.set("pos_emb", "alibi", a_origin)
    elif rope:
        f.set("pos_emb", "rotary", r_origin)
    else:
        f.set("pos_emb", "learned" if learned else "none",
              l_origin if l_found else "MPTConfig default (learned_pos_emb)")


def _sliding_window(v: View, f: Facts, impl: str, impl_origin: str) -> None:
    """``attn_config.sliding_window_size`` S (default -1: none).  The flash path calls
    flash_attn_varlen_func with ``window_size=(S, S)`` under the causal mask (llm-foundry's
    ``attention.py``): S + 1 keys per query; MPTConfig refuses a window with any other attn_impl
    ("sliding window only implemented with flash attention v2.3.0 or higher")."""
    dotted = "model.attn_config.sliding_window_size"
    value, origin, found = _value(v, dotted)
    if not found or value is None:
        return
    if isinstance(value, _Unknown) or (isinstance(value, str) and MARK_OPEN in value):
        f.set_unknown("attention_window", str(value) if isinstance(value, _Unknown) else
                      (f.u.reason(value) or "unknown"), origin)
        return
    n = None if isinstance(value, bool) else to_int(value)
    if n is None:
        raise CannotPredict(f"{dotted} {str(value)[:30]!r} is not an integer (MPT passes it to flash attention "
                            f"as a number of tokens)", origin)
    if n == -1:
        return                      # llm-foundry's default: no window
    if n < 1:
        raise CannotPredict(f"{dotted} {n}: a sliding window must reach at least 1 token back (-1, the default, "
                            f"is full attention)", origin)
    if impl != "flash":
        raise CannotPredict(f"{dotted} {n} with attn_impl {impl}: MPTConfig stops at start (\"sliding window only "
                            f"implemented with flash attention v2.3.0 or higher\")", origin or impl_origin)
    f.set("attention_window", n + 1, f"{origin} (sliding_window_size {n}: {n + 1} keys per query)")


def _layout(v: View, f: Facts, world: Optional[int], world_origin: str, gpn: Optional[int]) -> None:
    has_fsdp = bool(_section(v, "fsdp_config"))
    strategy, s_origin, found = _str(v, "fsdp_config.sharding_strategy", "FULL_SHARD")
    if not has_fsdp:
        f.set("zero_stage", 0, "no fsdp_config (Composer runs DDP)")
        # DDP under autocast keeps fp32 parameters, so their gradients are reduced in fp32
        f.set("grad_reduce_precision", "fp32", "no fsdp_config (DDP: fp32 parameters under autocast)")
        ac, origin, _ = False, "", False
    else:
        strategy = strategy.upper()
        if strategy not in _ZERO:
            raise CannotPredict(f"fsdp_config.sharding_strategy {strategy!r} is not one of "
                                f"{', '.join(_ZERO)}", s_origin)
        f.set("zero_stage", _ZERO[strategy], s_origin if found else "Composer default (FULL_SHARD)")
        _hybrid(v, f, strategy, s_origin, world, gpn)
        ac, origin, _ = _bool(v, "fsdp_config.activation_checkpointing", False)
    # Composer wraps each MPT block in a checkpoint wrapper: full recompute
    f.set("recompute", "full" if ac else "none", origin or "Composer default (no activation checkpointing)")


def _mixed_precision(v: View, f: Facts) -> None:
    """FSDP's gradient reduction dtype (``fsdp_config.mixed_precision``), once the training precision
    is known: PURE reduces in it (FSDP1's ``reduce_dtype`` = ``param_dtype``)."""
    if not _section(v, "fsdp_config"):
        return
    mp, origin, found = _value(v, "fsdp_config.mixed_precision")
    if not found or mp is None or isinstance(mp, _Unknown):
        f.set("grad_reduce_precision", "fp32", "Composer default (mixed_precision DEFAULT: reduced in fp32)")
        return
    if isinstance(mp, dict):
        # FSDP1's MixedPrecision: no reduce_dtype reduces in param_dtype, neither in the fp32 parameters'
        key = "reduce_dtype" if mp.get("reduce_dtype") else "param_dtype"
        name = str(mp.get(key) or "")
        reduce = next((p for p, spellings in _DTYPES.items() if name in spellings), None) if name else "fp32"
        why = f"{key} {name!r}" if name else "neither reduce_dtype nor param_dtype: fp32"
        if reduce is None:
            f.warnings.append(f"fsdp_config.mixed_precision.{key} {name!r} is not a dtype Composer reads "
                              f"({origin}); gradients modelled as reduced in fp32")
            reduce = "fp32"
        f.set("grad_reduce_precision", reduce, f"{origin} ({why})")
        return
    word = str(mp).upper()
    reduce = _REDUCE.get(word)
    if reduce is None:
        f.warnings.append(f"fsdp_config.mixed_precision {mp!r} is not DEFAULT, PURE or FULL ({origin}); "
                          f"gradients modelled as reduced in fp32")
        reduce = "fp32"
    if word == "FULL" and f.val("precision") in ("bf16", "fp16"):
        f.warnings.append(f"fsdp_config.mixed_precision FULL keeps FSDP's parameters in fp32 ({origin}): their "
                          f"all-gathers move fp32 and FSDP casts none, which perfcast does not model; costed "
                          f"as DEFAULT (gathered in {f.val('precision')}, reduced in fp32)")
    f.set("grad_reduce_precision", reduce or f.val("precision"), origin)


def _hybrid(v: View, f: Facts, strategy: str, s_origin: str, world: Optional[int], gpn: Optional[int]) -> None:
    """Hybrid sharding: FSDP shards within a group and replicates across groups (layout.dp_shard)."""
    shard_v, sh_origin, sh_found = _value(v, "fsdp_config.data_parallel_shard_degree")
    rep_v, r_origin, r_found = _value(v, "fsdp_config.data_parallel_replicate_degree")
    mesh, me_origin, me_found = _value(v, "fsdp_config.device_mesh")
    shard = to_int(shard_v) if sh_found and not isinstance(shard_v, _Unknown) else None
    rep = to_int(rep_v) if r_found and not isinstance(rep_v, _Unknown) else None
    origin = sh_origin if sh_found else r_origin
    if me_found and isinstance(mesh, list) and mesh:
        f.warnings.append(f"fsdp_config.device_mesh is Composer < 0.24's (later releases refuse it; "
                          f"data_parallel_shard_degree replaces it) ({me_origin})")
        if len(mesh) == 2:
            rep, shard, origin = to_int(mesh[0]), to_int(mesh[1]), me_origin
    if shard is not None and shard > 0 and world:
        if world % shard:
            raise CannotPredict(f"data_parallel_shard_degree {shard} does not divide the {world} GPUs "
                                f"(Composer cannot build its device mesh)", origin)
        if shard < world:
            _shard_group(f, shard, origin)
        return
    if rep is not None and rep > 1 and world and world % rep == 0:
        _shard_group(f, world // rep, origin)
        return
    if strategy == "HYBRID_SHARD":
        # Composer's hybrid default: shard within a node, replicate across nodes
        if gpn and world and world > gpn and world % gpn == 0:
            f.set("hsdp_shard", gpn, f"{s_origin} (HYBRID_SHARD: sharded over each node's {gpn} GPUs)")
        elif not gpn:
            f.warnings.append(f"HYBRID_SHARD: GPUs per node unknown; costed as FULL_SHARD ({s_origin})")
    elif strategy == "_HYBRID_SHARD_ZERO2" and not (gpn and world and world <= gpn):
        # Composer >= 0.24 builds a one-dimensional device mesh without a replicate degree and then
        # runs SHARD_GRAD_OP (distributed/dist_strategy.py); earlier releases let FSDP shard within
        # each node, as HYBRID_SHARD is read above
        f.warnings.append(f"_HYBRID_SHARD_ZERO2 without data_parallel_replicate_degree is costed as SHARD_GRAD_OP "
                          f"over all ranks, as Composer >= 0.24 runs it; earlier releases shard within each "
                          f"node and all-reduce the gradient shards across nodes, which is not modelled ({s_origin})")


def _shard_group(f: Facts, shard: int, origin: str) -> None:
    """FSDP shards over groups of ``shard`` ranks (fewer than the world): ZeRO-3's hybrid sharding,
    or ZeRO-2's (Composer's _HYBRID_SHARD_ZERO2 on a two-dimensional mesh: each block gathered and
    its gradients reduce-scattered within the group every micro-batch, the gradient shards
    all-reduced across the groups)."""
    if f.val("zero_stage") in (2, 3):
        f.set("hsdp_shard", shard, origin)


def _batch(v: View, f: Facts, world: Optional[int], world_origin: str) -> None:
    """llm-foundry's batch rule: the global batch is split evenly over the ranks (it stops otherwise),
    each rank's share runs in micro-batches of device_train_microbatch_size (the last one smaller
    when it does not divide; Composer counts ceil(share / micro) micro-batches)."""
    micro, m_origin, m_found = _value(v, "device_train_microbatch_size")
    gbs, g_origin, g_found = _value(v, "global_train_batch_size")
    if not g_found or gbs is None:
        raise CannotPredict("global_train_batch_size not found (llm-foundry needs it)", v.cfg.label)
    f.set_int_value("foundry_global", gbs, g_origin, what="global_train_batch_size")
    if not f.known("foundry_global"):
        raise CannotPredict(f"layout.micro_batches unknown: {f.get('foundry_global').unknown}", g_origin)
    if not m_found or str(micro).strip().lower() == "auto":
        why = ("device_train_microbatch_size is 'auto'" if m_found else
               "device_train_microbatch_size is not set (llm-foundry's default is 'auto'),")
        f.set_unknown("micro_batch", f"{why} Composer picks the micro-batch at run time by trying sizes until "
                                     f"one fits in memory; give a number", m_origin or v.cfg.label)
        return
    if isinstance(micro, float) and not micro.is_integer():
        raise CannotPredict(f"device_train_microbatch_size {micro} is fractional (sequence-packing recipes); "
                            f"give a whole number", m_origin)
    f.set_int_value("micro_batch", micro, m_origin, what="device_train_microbatch_size")
    if not (f.known("micro_batch") and f.known("foundry_global")) or world is None:
        return
    mb, g = f.val("micro_batch"), f.val("foundry_global")
    if mb < 1 or g < 1:
        return
    if g % world:
        raise CannotPredict(f"global_train_batch_size {g} is not divisible by the {world} GPUs "
                            f"(llm-foundry stops at start)", g_origin)
    share = g // world
    if mb > share:
        f.warnings.append(f"device_train_microbatch_size {mb} > the {share} samples per GPU: llm-foundry "
                          f"reduces it to {share} ({m_origin})")
        mb = share
        f.set("micro_batch", mb, f"{m_origin} (reduced to global_train_batch_size / GPUs)")
    steps = math.ceil(share / mb)
    if share % mb:
        f.warnings.append(f"{share} samples per GPU in micro-batches of {mb}: the last of {steps} is smaller; "
                          f"costed as {steps} full ones ({m_origin})")
    f.set("global_batch", mb * steps * world, g_origin)


def _run(v: View, f: Facts) -> None:
    w = f.warnings
    md, md_origin, found = _value(v, "max_duration")
    if not found or md is None:
        raise CannotPredict("max_duration not found (llm-foundry needs it)", v.cfg.label)
    if isinstance(md, _Unknown):
        f.set_unknown("train_iters", str(md), md_origin)
    else:
        n, unit = duration(md, "max_duration", md_origin)
        if unit == "ba":
            f.set("train_iters", n, md_origin)
        elif unit == "tok":
            f.set("train_tokens", n, md_origin)
        elif unit == "sp":
            f.set("train_samples", n, md_origin)
        else:
            raise CannotPredict(f"max_duration {md!r} counts {'epochs' if unit == 'ep' else 'a fraction'} of the "
                                f"data set, whose size perfcast does not know; give it in batches (ba) or "
                                f"tokens (tok)", md_origin)
    _precision(v, f)
    _mixed_precision(v, f)
    _compile(v, f)
    _evaluation(v, f)
    folder, fo_origin, fo_found = _str(v, "save_folder")
    if not fo_found or not folder:
        f.set("save_interval", 0, fo_origin or "no save_folder (Composer saves no checkpoints)")
    else:
        si, si_origin, si_found = _value(v, "save_interval")
        n, unit = duration(si if si_found and si is not None else "1000ba", "save_interval", si_origin)
        if unit == "ba":
            f.set("save_interval", n, si_origin if si_found else "llm-foundry default (save_interval 1000ba)")
        else:
            w.append(f"save_interval {si!r} is not in batches ({si_origin}); checkpoints are not modelled")
            f.set("save_interval", 0, si_origin)


def _compile(v: View, f: Facts) -> None:
    # Composer compiles the model when compile_config is a mapping ({} for torch.compile's
    # defaults); None, its default, leaves it eager.
    value, origin, found = _value(v, "compile_config")
    if found and not isinstance(value, _Unknown):
        f.set("compile", isinstance(value, dict), origin)


def _precision(v: View, f: Facts) -> None:
    p, origin, found = _str(v, "precision", "amp_bf16")
    origin = origin if found else "llm-foundry default (amp_bf16)"
    p = p.lower()
    if p == "amp_fp8":
        f.set("precision", "bf16", origin)
        fc, fc_origin, _ = _str(v, "model.fc_type", "torch")
        ffn, _o, _f = _str(v, "model.ffn_config.ffn_type", "mptmlp")
        if fc == "te" or ffn == "te_ln_mlp":
            # Composer's amp_fp8 is Transformer Engine's fp8_autocast with its default recipe
            f.set("fp8_recipe", "delayed", origin)
        else:
            f.warnings.append(f"precision amp_fp8 with model.fc_type {fc!r}: only Transformer Engine layers "
                              f"(fc_type te) run in FP8, so the GEMMs stay bf16 ({fc_origin or origin})")
    elif p in ("amp_bf16", "bf16"):
        f.set("precision", "bf16", origin)
    elif p in ("amp_fp16", "fp16"):
        f.set("precision", "fp16", origin)
    elif p == "fp32":
        f.set("precision", "fp32", origin)
    else:
        raise CannotPredict(f"precision {p!r} is not amp_bf16, amp_fp16, amp_fp8 or fp32", origin)


def _evaluation(v: View, f: Facts) -> None:
    loader, l_origin, l_found = _value(v, "eval_loader")
    if not l_found or not loader:
        f.set("eval_interval", 0, "no eval_loader (no evaluation)")
        f.set("eval_iters", 0, "no eval_loader (no evaluation)")
        return
    ei, e_origin, _ = _value(v, "eval_interval")
    n, unit = duration(ei, "eval_interval", e_origin) if ei is not None else (0, "none")
    sub, s_origin, s_found = _value(v, "eval_subset_num_batches")
    k = to_int(sub) if s_found else -1
    if unit != "ba" or k is None or k < 0:
        why = ("eval_interval is not set (llm-foundry requires it)" if unit == "none"
               else f"eval_interval {ei!r} is not in batches" if unit != "ba"
               else f"eval_subset_num_batches {sub!r} is not a number of batches" if k is None
               else "eval_subset_num_batches -1 evaluates the whole validation set, whose size perfcast does not "
                    "know")
        f.warnings.append(f"{why} ({e_origin if unit != 'ba' else s_origin or e_origin}); evaluation is not "
                          f"modelled")
        f.set("eval_interval", 0, e_origin)
        f.set("eval_iters", 0, e_origin)
        return
    f.set("eval_interval", n, e_origin)
    f.set("eval_iters", k, s_origin)
