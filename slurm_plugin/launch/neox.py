"""GPT-NeoX: ``deepy.py train.py [-d DIR] a.yml b.yml`` -> merged YAML -> facts.

Rules from megatron/neox_arguments (docs/launch-config-keys.md §1 and patterns 25–35): top-level
keys in dash or underscore spelling, files merged in order, a later *underscore* key that repeats
an earlier key is a NeoX "duplicate keys" error while a later dash key silently overrides;
gated-MLP widths follow ParallelMLP; gradient_accumulation_steps defaults to 1.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Optional

from . import moe
from .configs import Config, check_duplicates, to_bool, to_int, to_number
from .facts import Facts
from .limits import CannotPredict
from .neox_keys import (CONTIGUOUS_NEEDS_PARTITION, NEOX_KEYS, NEOX_SHAPE_KEYS, check_keys, check_zero_keys,
                        check_zero_stage, refuse_choice)
from .values import MARK_OPEN, Tok

GATED = {"geglu", "reglu", "swiglu", "bilinear", "glu"}
# NeoX's fixed choices: the Literal types of megatron/neox_arguments/neox_args.py (the union of the
# 2021-2023 releases and EleutherAI/gpt-neox at ea7aefd8, 2026; ATTENTION_TYPE_CHOICES there).
# NeoXArgs.validate_types refuses any other value before training starts ("Not in accepted
# values"), comparing in any case; attention types are asserted in NeoX's exact spelling.
NORMS = ("layernorm", "rmsnorm", "scalenorm", "te_rmsnorm", "te_layernorm", "non_parametric_layernorm")
POS_EMBS = ("learned", "rotary", "sinusoidal", "rpe", "alibi", "none")
ACTIVATIONS = ("gelu", "geglu", "relu", "softsign", "swish", "mish", "silu", "reglu", "swiglu", "bilinear", "glu")
PRECISIONS = ("fp16", "fp32", "bfloat16")
ATTENTION_TYPES = ("global", "local", "sparse_fixed", "sparse_variable", "bigbird", "bslongformer", "gmlp", "amlp",
                   "flash", "rwkv", "mamba")
_REFUSED = "NeoX's argument check (NeoXArgs.validate_types) refuses it and the job stops at start"
# The names DeepSpeed's ``type:REGEX`` partitioning matches against, for GPT-NeoX's pipeline items
# (GPT2ModelPipe): embedding, pre hook, a transformer layer, post hook, final norm, output layer
# (a second EmbeddingPipe when the embeddings are tied).
_PIPE_ITEMS = ("EmbeddingPipe", "_pre_transformer_block", "ParallelTransformerLayerPipe",
               "_post_transformer_block", "NormPipe")
_NEOX_DEFAULT_TYPE = "transformer|mlp"


@dataclass
class DeepyArgs:
    user_script: Optional[Tok]
    conf_dir: Optional[str]
    confs: list          # Toks
    hostfile: Optional[Tok]


def read_deepy_args(args: list) -> DeepyArgs:
    """consume_deepy_args: USER_SCRIPT [--conf_dir|-d DIR] CONF [CONF ...] plus a few options."""
    out = DeepyArgs(None, None, [], None)
    i, n = 0, len(args)
    with_value = {"--wandb_group", "--wandb_run_name", "--wandb_team", "--eval_tasks", "--iteration",
                  "--eval_results_prefix", "-i", "--sample_input_file", "-o", "--sample_output_file",
                  "--autotuning"}
    while i < n:
        t = args[i].text
        if t in ("-d", "--conf_dir", "--conf-dir"):
            if i + 1 < n:
                out.conf_dir = args[i + 1].text
            i += 2
            continue
        if t.startswith("--conf_dir="):
            out.conf_dir = t.split("=", 1)[1]
            i += 1
            continue
        if t in ("-H", "--hostfile"):
            if i + 1 < n:
                out.hostfile = args[i + 1]
            i += 2
            continue
        if t in with_value:
            i += 2
            continue
        if t.startswith("-"):
            i += 1
            continue
        if out.user_script is None:
            out.user_script = args[i]
        else:
            out.confs.append(args[i])
        i += 1
    return out


class Merged:
    """The merged NeoX config: normalized key -> (value, Config, raw key)."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[Any, Config, str]] = {}

    def add(self, cfg: Config, warnings: list) -> None:
        if not isinstance(cfg.data, dict):
            warnings.append(f"{cfg.label} is not a mapping of NeoX keys; ignored")
            return
        if cfg.duplicates:
            check_duplicates(cfg, "GPT-NeoX (PyYAML)", False, warnings)
        for raw, value in cfg.data.items():
            key = raw.replace("-", "_")
            if key in self.items and raw == key and self.items[key][1] is not cfg:
                warnings.append(f"NeoX would stop with 'duplicate keys' for {raw} "
                                f"({cfg.origin((raw,))} repeats {self.items[key][1].origin((self.items[key][2],))});"
                                f" using the later value")
            self.items[key] = (value, cfg, raw)

    def has(self, key: str) -> bool:
        return key in self.items

    def raw(self, key: str, default: Any = None) -> Any:
        it = self.items.get(key)
        return default if it is None else it[0]

    def origin(self, key: str, sub: tuple = ()) -> str:
        it = self.items.get(key)
        if it is None:
            return ""
        return it[1].origin((it[2],) + sub) if sub and (it[2],) + sub in it[1].lines else it[1].origin((it[2],))


# Keys whose NeoX default is a number: a YAML null there is None in NeoXArgs, which the layout
# arithmetic cannot use (the keys whose default is None, num_kv_heads say, may be null).
_NOT_NULL = frozenset(("num_layers", "hidden_size", "num_attention_heads", "seq_length", "model_parallel_size",
                       "pipe_parallel_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"))


def _int(facts: Facts, m: Merged, key: str, fact: str) -> None:
    if not m.has(key):
        return
    v = m.raw(key)
    origin = m.origin(key)
    if isinstance(v, str) and MARK_OPEN in v:
        facts.set_unknown(fact, facts.u.reason(v) or "unknown", origin)
        return
    if v is None:
        if key in _NOT_NULL:
            facts.warnings.append(f"{key} is null ({origin}): NeoX keeps None there, not its default, "
                                  f"and expects a number; read as not set")
        return
    n = to_int(v)
    if n is None:
        facts.warnings.append(f"{key} = {str(v)[:30]!r} is not an integer ({origin})")
        facts.set_unknown(fact, f"{key} is {str(v)[:30]!r}", origin)
        return
    facts.set(fact, n, origin)


def _str(m: Merged, key: str) -> Optional[str]:
    v = m.raw(key)
    return v if isinstance(v, str) else None


def _check_moe(m: Merged) -> None:
    """Refuse an MoE config: moe_num_experts > 1, or moe_type without a dense moe_num_experts."""
    if m.has("moe_num_experts"):
        moe.check_count(m.raw("moe_num_experts"), "moe_num_experts", m.origin("moe_num_experts"))
    elif m.has("moe_type") and m.raw("moe_type"):
        moe.refuse(f"moe_type = {str(m.raw('moe_type'))[:30]}", m.origin("moe_type"))


def read_merged(m: Merged, facts: Facts) -> None:
    f = facts
    w = f.warnings
    _check_moe(m)
    check_keys(((raw, cfg.origin((raw,))) for _v, cfg, raw in m.items.values()), NEOX_KEYS, NEOX_SHAPE_KEYS,
               "GPT-NeoX", "the NeoX configs", w)
    for key, fact in (("num_layers", "layers"), ("hidden_size", "hidden"), ("num_attention_heads", "heads"),
                      ("num_kv_heads", "kv_heads"), ("seq_length", "seq_len"), ("model_parallel_size", "tp"),
                      ("pipe_parallel_size", "pp"), ("train_micro_batch_size_per_gpu", "micro_batch"),
                      ("gradient_accumulation_steps", "grad_accum"), ("train_batch_size", "global_batch"),
                      ("train_iters", "train_iters"), ("eval_interval", "eval_interval"),
                      ("eval_iters", "eval_iters"), ("global_num_gpus", "global_num_gpus"),
                      ("num_gpus", "neox_num_gpus"), ("num_nodes", "neox_num_nodes"),
                      ("padded_vocab_size", "padded_vocab"), ("make_vocab_size_divisible_by", "vocab_divisible"),
                      ("intermediate_size", "intermediate_size"), ("mlp_multiple_of", "mlp_multiple_of"),
                      ("exit_interval", "exit_interval")):
        _int(f, m, key, fact)
    if f.get("seq_len") is None and m.has("max_position_embeddings"):
        _int(f, m, "max_position_embeddings", "seq_len")
        w.append("seq_length not set: using max_position_embeddings as NeoX does")
    if f.known("pp") and f.val("pp") == 0:
        f.set("pp", 1, f.origin("pp"))
    if f.get("micro_batch") is None and m.has("batch_size"):
        _int(f, m, "batch_size", "micro_batch")
    if f.get("grad_accum") is None:
        if m.has("gas"):
            _int(f, m, "gas", "grad_accum")   # old NeoX: derived duplicate, accepted as input there
        else:
            f.set("grad_accum", 1, "NeoX default (gradient_accumulation_steps = 1)")
            f.set("grad_accum_defaulted", True, "NeoX default")
    if m.has("train_epochs") and f.get("train_iters") is None:
        f.set_unknown("train_iters", "train_epochs is set: the iteration count depends on the data set size",
                      m.origin("train_epochs"))
    if f.get("eval_interval") is None:
        f.set("eval_interval", 1000, "NeoX default")
    if f.get("eval_iters") is None:
        f.set("eval_iters", 100, "NeoX default")
    # checkpoints: checkpoint_factor (new) or save_interval (before 2022-12), only with `save`
    ck_key = "checkpoint_factor" if m.has("checkpoint_factor") else ("save_interval" if m.has("save_interval")
                                                                     else None)
    if ck_key is not None:
        if not m.raw("save"):
            w.append(f"{ck_key} without `save`: no checkpoints are written")
            f.set("save_interval", 0, m.origin(ck_key))
        else:
            v = to_number(m.raw(ck_key))
            if v is None:
                f.set_unknown("save_interval", f"{ck_key} is {m.raw(ck_key)!r}", m.origin(ck_key))
            elif (_str(m, "checkpoint_scale") or "linear") == "log":
                w.append("checkpoint_scale: log saves at powers of the factor; modelled as no periodic saves")
                f.set("save_interval", 0, m.origin("checkpoint_scale"))
            else:
                f.set("save_interval", int(v), m.origin(ck_key))
    # model kind
    _norm(m, f)
    _pos_emb(m, f)
    nwt = to_bool(m.raw("no_weight_tying", False))
    f.set("tied_embeddings", not nwt, m.origin("no_weight_tying") or "NeoX default")
    f.set("parallel_residual", bool(to_bool(m.raw("gpt_j_residual", False))),
          m.origin("gpt_j_residual") or "NeoX default")
    f.set("sequence_parallel", bool(to_bool(m.raw("sequence_parallel", False))),
          m.origin("sequence_parallel") or "NeoX default")
    _attention(m, f)
    _sliding_window(m, f)
    _mlp(m, f)
    _linear_bias(m, f, w)
    _precision(m, f)
    z = m.raw("zero_optimization")
    if isinstance(z, dict):
        check_zero_keys(z, lambda k: m.origin("zero_optimization", (k,)), "zero_optimization", w)
    if isinstance(z, dict) and "stage" in z:
        check_zero_stage(z["stage"], "the NeoX configs", m.origin("zero_optimization", ("stage",)))
        st = to_int(z["stage"])
        if st is None:
            raw = z["stage"]
            why = f.u.reason(raw) if isinstance(raw, str) and MARK_OPEN in raw else None
            f.set_unknown("zero_stage", why or f"zero_optimization.stage is {raw!r}",
                          m.origin("zero_optimization", ("stage",)))
        else:
            f.set("zero_stage", st, m.origin("zero_optimization", ("stage",)))
    elif isinstance(z, bool):
        f.set("zero_stage", 1 if z else 0, m.origin("zero_optimization"))
    else:
        f.set("zero_stage", 0, m.origin("zero_optimization") or "NeoX default (ZeRO stage 0)")
    _pipe_partition(m, f)
    ca = to_bool(m.raw("checkpoint_activations", False))
    f.set("recompute", "full" if ca else "none", m.origin("checkpoint_activations") or "NeoX default")
    _checkpoint_options(m, f, bool(ca))
    # vocabulary
    tok = _str(m, "tokenizer_type") or "GPT2BPETokenizer"
    f.set("tokenizer", tok, m.origin("tokenizer_type") or "NeoX default")
    vf = _str(m, "vocab_file")
    if vf:
        f.set("vocab_file", vf, m.origin("vocab_file"))
    # launcher-side keys
    for key in ("hostfile", "launcher", "include", "exclude"):
        v = _str(m, key)
        if v:
            f.set(f"neox_{key}", v, m.origin(key))
    if to_bool(m.raw("deepspeed_slurm", False)):
        f.set("neox_deepspeed_slurm", True, m.origin("deepspeed_slurm"))


def _choice(m: Merged, key: str, accepted: tuple) -> Optional[str]:
    """The value of a key of fixed choices as NeoX reads it, or None (absent, null, or unknown in
    the script: the caller models its default). A value NeoX's argument check refuses stops."""
    if not m.has(key) or m.raw(key) is None:
        return None
    v = m.raw(key)
    if isinstance(v, str) and MARK_OPEN in v:
        return None
    if not isinstance(v, str) or v.lower() not in accepted:
        refuse_choice(key, v, accepted, _REFUSED, m.origin(key))
    return v


def _exact(m: Merged, key: str, v: str, builder: str) -> str:
    """NeoX's argument check accepts its choices in any case, but ``builder`` compares the exact
    spelling and raises on another one: the job stops at start."""
    if v != v.lower():
        raise CannotPredict(f"{key} {v!r}: NeoX's argument check accepts it in any case, but {builder} compares "
                            f"{v.lower()!r} exactly and the job stops at start (did you mean {v.lower()!r}?)",
                            m.origin(key))
    return v


def _norm(m: Merged, f: Facts) -> None:
    """``norm`` (megatron/model/norms.py ``get_norm``): the RMS norms are rmsnorm, the others layernorm."""
    got = _model_choice(m, f, "norm", NORMS, "layernorm")
    if got is None:
        return
    norm, origin = _exact(m, "norm", got[0], "get_norm"), got[1]
    f.set("norm", "rmsnorm" if "rms" in norm else "layernorm", origin)
    if norm == "scalenorm":
        f.warnings.append(f"norm: scalenorm (one gain per norm) is modelled as layernorm ({origin})")
    elif norm == "non_parametric_layernorm":
        f.warnings.append(f"norm: non_parametric_layernorm (no weight or bias) is modelled as layernorm, whose "
                          f"2 × hidden parameters per norm are counted ({origin})")


def _pos_emb(m: Merged, f: Facts) -> None:
    """``pos_emb``: sinusoidal adds no parameters (costed as learned), rpe's T5 bias as none."""
    got = _model_choice(m, f, "pos_emb", POS_EMBS, "learned")
    if got is None:
        return
    pos, origin = got
    if pos != pos.lower():
        # The embedding and attention compare pos_emb with "rotary", "learned", … exactly.
        f.warnings.append(f"pos_emb {pos!r}: NeoX's argument check accepts it in any case, but its model "
                          f"compares {pos.lower()!r} exactly and applies no position embedding; modelled as none "
                          f"({origin})")
        f.set("pos_emb", "none", origin)
        return
    mapped = {"sinusoidal": "learned", "rpe": "none"}.get(pos, pos)
    if pos in ("sinusoidal", "rpe"):
        f.warnings.append(f"pos_emb: {pos} is modelled as {mapped} ({origin})")
    f.set("pos_emb", mapped, origin)


def _model_choice(m: Merged, f: Facts, key: str, accepted: tuple, default: str) -> Optional[tuple[str, str]]:
    """(value, origin) of a model key of fixed choices, for the caller to map onto the fact ``key``;
    None when that fact is already set: NeoX's default for an absent or null key, unknown for a
    value the script leaves unknown."""
    v = _choice(m, key, accepted)
    if v is not None:
        return v, m.origin(key)
    raw = m.raw(key)
    if isinstance(raw, str) and MARK_OPEN in raw:
        f.set_unknown(key, f.u.reason(raw) or "unknown", m.origin(key))
    else:
        f.set(key, default, m.origin(key) or "NeoX default")
    return None


# GPT-NeoX's arguments to deepspeed.checkpointing.configure (megatron/initialize.py) -> layout keys
_CHECKPOINT_OPTIONS = (("partition_activations", "partition_activations"),
                       ("checkpoint_in_cpu", "checkpoint_in_cpu"),
                       ("synchronize_each_layer", "checkpoint_sync_each_layer"))


def _checkpoint_options(m: Merged, f: Facts, checkpointed: bool) -> None:
    """DeepSpeed's activation-checkpointing options, which act on checkpointed layers only.

    NeoX passes its own keys to ``deepspeed.checkpointing.configure`` (each a bool, so each
    overrides a DeepSpeed ``activation_checkpointing`` section in the YAML, which is said);
    ``contiguous_checkpointing`` copies the partitions into one preallocated buffer (allocator
    fragmentation: the framework reserve) and needs ``partition_activations``, or DeepSpeed stops."""
    w = f.warnings
    on = []
    for key, fact in _CHECKPOINT_OPTIONS:
        v = m.raw(key, False)
        if isinstance(v, str) and MARK_OPEN in v:
            if checkpointed:
                f.set_unknown(fact, f.u.reason(v) or "unknown", m.origin(key))
            continue
        if to_bool(v):
            on.append((key, fact))
    if to_bool(m.raw("contiguous_checkpointing", False)) and not to_bool(m.raw("partition_activations", False)):
        w.append(f"contiguous_checkpointing without partition_activations: {CONTIGUOUS_NEEDS_PARTITION} "
                 f"({m.origin('contiguous_checkpointing')})")
    section = m.raw("activation_checkpointing")
    if isinstance(section, dict) and any(to_bool(v) for k, v in section.items() if k != "number_checkpoints"):
        w.append(f"activation_checkpointing: GPT-NeoX configures DeepSpeed's checkpointing from its own keys "
                 f"(partition_activations, checkpoint_in_cpu, synchronize_each_layer), which override this "
                 f"section ({m.origin('activation_checkpointing')})")
    if not on:
        return
    if not checkpointed:
        w.append(f"{', '.join(k for k, _ in on)} without checkpoint_activations: DeepSpeed applies "
                 f"{'them' if len(on) > 1 else 'it'} to checkpointed layers only; not costed "
                 f"({m.origin(on[0][0])})")
        return
    for key, fact in on:
        f.set(fact, True, m.origin(key))


def _type_matches(pattern: str, tied: bool) -> Optional[tuple]:
    """Which pipeline items ``type:pattern`` weighs 1, or None for a pattern we do not evaluate.

    DeepSpeed compiles the pattern as a case-insensitive regex and searches each item's class or
    function name.  Only alternatives of plain names are evaluated here (a plain name is a
    substring search): a script's regex is not run, so it cannot stall the parser.
    """
    alts = pattern.lower().split("|")
    if not all(re.fullmatch(r"[a-z0-9_]+", a) for a in alts):
        return None
    names = _PIPE_ITEMS + ("EmbeddingPipe" if tied else "ParallelLinearPipe",)
    return tuple(any(a in name.lower() for a in alts) for name in names)


def _pipe_partition(m: Merged, f: Facts) -> None:
    """``pipe_partition_method`` -> the pipe_split rule (predictor.recipe.pipeline_split)."""
    key = "pipe_partition_method"
    default_origin = f"NeoX default (pipe_partition_method type:{_NEOX_DEFAULT_TYPE})"
    if not m.has(key) or m.raw(key) is None:
        f.set("pipe_split", "neox", default_origin)
        return
    v, origin = m.raw(key), m.origin(key)
    if isinstance(v, str) and MARK_OPEN in v:
        f.set_unknown("pipe_split", f.u.reason(v) or "unknown", origin)
        return
    # DeepSpeed's PipelineModule._partition_layers: method.lower() is uniform, parameters or
    # type:REGEX, anything else raises NotImplementedError; NeoX builds its model as a
    # PipelineModule at any pipe_parallel_size, so a refused method stops every job.
    accepted = ("uniform", "parameters", "type:transformer|mlp", "type:transformer")
    choices = "uniform, parameters, type:REGEX naming pipeline layers (NeoX's default type:transformer|mlp)"
    if not isinstance(v, str):
        refuse_choice(key, v, accepted, "DeepSpeed's pipeline partitioning stops the job at start", origin, choices)
    method = v.strip().lower()
    if method == "parameters":
        f.set("pipe_split", "deepspeed_parameters", origin)
        return
    if method == "uniform":
        f.set("pipe_split", "deepspeed_uniform", origin)
        return
    tied = not to_bool(m.raw("no_weight_tying", False))
    if method.startswith("type:"):
        got = _type_matches(method.split(":")[1], tied)
        if got == _type_matches(_NEOX_DEFAULT_TYPE, tied):
            f.set("pipe_split", "neox", origin)
            return
        if got is None:
            why = "is a regex this reader does not evaluate"
        elif not any(got):
            refuse_choice(key, v, accepted, "its regex matches no layer of GPT-NeoX's pipeline and DeepSpeed "
                          "stops at start ('found no valid layers to partition')", origin, choices)
        else:
            why = "weighs other layers than type:transformer|mlp, which is not modelled"
    else:
        refuse_choice(key, v, accepted, "DeepSpeed raises NotImplementedError for another partition method and "
                      "the job stops at start", origin, choices)
    f.warnings.append(f"pipe_partition_method {str(v)[:40]!r} {why} ({origin}); "
                      f"using NeoX's default type:{_NEOX_DEFAULT_TYPE}")
    f.set("pipe_split", "neox", origin)


def _attention(m: Merged, f: Facts) -> None:
    cfg = m.raw("attention_config")
    fused = to_bool(m.raw("scaled_upper_triang_masked_softmax_fusion", False))
    dense = "fused_softmax" if fused else "unfused"
    origin = m.origin("attention_config") or m.origin("scaled_upper_triang_masked_softmax_fusion") or "NeoX default"
    if not cfg:
        f.set("attention", dense, origin)
        return
    kinds: dict = {}
    try:
        if isinstance(cfg, list) and all(isinstance(e, str) for e in cfg):
            # Already expanded, one type per layer: NeoX's expand_attention_types takes it as is.
            for t in cfg:
                kinds[t] = kinds.get(t, 0) + 1
        else:
            for entry in cfg:
                types, count = entry[0], entry[1]
                n = to_int(count) if count != "all" else 10**6
                if not n or n <= 0:
                    continue        # expanded to no layer: NeoX never checks its types
                for t in types if isinstance(types, list) else [types]:
                    kinds[t] = kinds.get(t, 0) + n
    except (TypeError, IndexError, KeyError):
        f.warnings.append(f"attention_config is not a list of [[types], count] ({origin}); assuming global")
        f.set("attention", dense, origin)
        return
    for t in kinds:
        # NeoXArgs asserts each expanded type is in ATTENTION_TYPE_CHOICES ("Attention type X not recognized")
        if not (isinstance(t, str) and (t in ATTENTION_TYPES or MARK_OPEN in t)):
            refuse_choice("attention_config type", t, ATTENTION_TYPES, "NeoX asserts it (\"Attention type … not "
                          "recognized\") and the job stops at start", origin)
    kinds = {t: n for t, n in kinds.items() if MARK_OPEN not in t}
    if not kinds:
        f.set("attention", dense, origin)
        return
    main = max(kinds, key=kinds.get)
    if len(kinds) > 1:
        f.warnings.append(f"attention_config mixes {', '.join(sorted(kinds))}; modelled as {main} everywhere")
    if main == "flash":
        f.set("attention", "flash", origin)
        f.set("attention_impl", "flash2", origin)     # NeoX calls the flash_attn package (FlashAttention-2)
    else:
        if main in ("gmlp", "amlp", "rwkv", "mamba"):
            f.warnings.append(f"attention type {main} is not an attention layer; its layers are modelled as "
                              f"transformer layers with global attention, whose shapes and cost differ ({origin})")
        elif main != "global":
            f.warnings.append(f"attention type {main} is modelled as global attention (every key attended: an upper "
                              f"bound on its cost) ({origin})")
        f.set("attention", dense, origin)


def _sliding_window(m: Merged, f: Facts) -> None:
    """``sliding_window_width`` W (NeoX's default None: full attention): flash attention gets
    ``window_size=(W, -1)`` under its causal mask (megatron/model/transformer.py), and the other
    paths' mask keeps keys i − W … i (megatron/utils.py ``get_attn_mask``, ``triu(diagonal=-W)``):
    W + 1 keys per query either way."""
    if not m.has("sliding_window_width") or m.raw("sliding_window_width") is None:
        return
    v, origin = m.raw("sliding_window_width"), m.origin("sliding_window_width")
    if isinstance(v, str) and MARK_OPEN in v:
        f.set_unknown("attention_window", f.u.reason(v) or "unknown", origin)
        return
    n = None if isinstance(v, bool) else to_int(v)
    if n is None:
        raise CannotPredict(f"sliding_window_width = {str(v)[:30]!r} is not an integer (NeoX passes it to the "
                            f"attention as a number of tokens)", origin)
    if n < 1:
        raise CannotPredict(f"sliding_window_width = {n}: a sliding window must reach at least 1 token back "
                            f"(leave it out, or null, for full attention)", origin)
    f.set("attention_window", n + 1, f"{origin} (sliding_window_width {n}: {n + 1} keys per query)")


def _mlp(m: Merged, f: Facts) -> None:
    """FFN width as ParallelMLP computes it (pattern 31)."""
    act = _choice(m, "activation", ACTIVATIONS)
    act = _exact(m, "activation", act, "get_activation") if act is not None else "gelu"
    mlp_type = (_str(m, "mlp_type") or "regular").lower()
    gated = act in GATED or mlp_type == "llama"
    origin = m.origin("activation") or m.origin("mlp_type") or "NeoX default"
    raw = m.raw("activation")
    if isinstance(raw, str) and MARK_OPEN in raw and mlp_type != "llama":
        # unknown in the script: gated or not decides the MLP's width, so both stay unknown
        reason = f.u.reason(raw) or "unknown"
        f.set_unknown("activation", reason, m.origin("activation"))
        f.set_unknown("ffn_hidden", reason, m.origin("activation"))
        return
    f.set("activation", "swiglu" if gated else "gelu", origin)
    if not gated and act != "gelu":
        f.warnings.append(f"activation {act} is modelled as gelu (an ungated MLP of the same shapes) ({origin})")
    elif gated and act not in ("swiglu", "silu", "gelu"):
        # geglu, reglu, bilinear, glu: NeoX's gated MLP, of swiglu's shapes (two input projections)
        f.warnings.append(f"activation {act} is modelled as swiglu (a gated MLP of the same shapes) ({origin})")
    if not f.known("hidden"):
        return
    h = f.val("hidden")
    mult = f.val("mlp_multiple_of", 1) or 1
    if mlp_type == "llama" and f.get("intermediate_size") is None:
        # LLaMAParallelMLP: intermediate_size when given (Mistral's 14336), else 2/3 of 4h rounded
        # up to its multiple_of, 256.
        ffn = _roundup(int(2 * 4 * h / 3), 256)
        f.set("ffn_hidden", ffn, m.origin("mlp_type"))
        return
    if f.get("intermediate_size") is not None:
        if not f.known("intermediate_size"):
            fi = f.get("intermediate_size")
            f.set_unknown("ffn_hidden", fi.unknown or "unknown", fi.origin)
            return
        inter = f.val("intermediate_size")
        origin = f.origin("intermediate_size")
    elif m.has("expansion_factor") and to_number(m.raw("expansion_factor")) is not None:
        inter = int(to_number(m.raw("expansion_factor")) * h)
        origin = m.origin("expansion_factor")
    else:
        inter = 4 * h
        origin = f.origin("hidden")
    if mlp_type == "llama":
        ffn = inter          # LLaMAParallelMLP takes intermediate_size as its width, as it is
    elif gated:
        ffn = _roundup(int(inter * 2 / 3) // 2, mult)
    else:
        ffn = _roundup(inter, mult)
    f.set("ffn_hidden", ffn, origin)


def _linear_bias(m: Merged, f: Facts, w: list) -> None:
    """Biases on the linear layers, where the config says (``use_bias_in_attn_linear``,
    ``use_bias_in_mlp``; NeoX's defaults are both true). Neither given: the norm decides, as for
    any job (``model.linear_bias`` left out), since NeoX's LLaMA-style configs predate the keys."""
    keys = [k for k in ("use_bias_in_attn_linear", "use_bias_in_mlp") if m.has(k)]
    if not keys:
        return
    values = {}
    for k in ("use_bias_in_attn_linear", "use_bias_in_mlp"):
        v = to_bool(m.raw(k, True))
        if v is None:
            w.append(f"{k} is {m.raw(k)!r}, not a boolean: taken as NeoX's default, true ({m.origin(k)})")
            v = True
        values[k] = v
    attn, mlp = values["use_bias_in_attn_linear"], values["use_bias_in_mlp"]
    if attn != mlp:
        # One switch in the job: the MLP's, whose projections hold two thirds of a layer's linear
        # weights; the attention's biases (a few thousand parameters) are then miscounted.
        w.append(f"use_bias_in_attn_linear {str(attn).lower()} with use_bias_in_mlp {str(mlp).lower()}: "
                 f"the attention projections are modelled {'with' if mlp else 'without'} biases, as the MLP's "
                 f"({m.origin('use_bias_in_attn_linear') or 'NeoX default'})")
    f.set("linear_bias", mlp, m.origin("use_bias_in_mlp") or m.origin(keys[0]))


def _roundup(x: int, m: int) -> int:
    return int(math.ceil(x / m) * m) if m > 1 else x


def _precision(m: Merged, f: Facts) -> None:
    p = _choice(m, "precision", PRECISIONS)
    if p:
        f.set("precision", {"fp16": "fp16", "bfloat16": "bf16", "fp32": "fp32"}[p.lower()], m.origin("precision"))
        return
    bf = m.raw("bf16")
    if isinstance(bf, dict) and to_bool(bf.get("enabled", True)):
        f.set("precision", "bf16", m.origin("bf16"))
        return
    fp = m.raw("fp16")
    if isinstance(fp, dict) and to_bool(fp.get("enabled", True)):
        typ = str(fp.get("type", "")).lower()
        f.set("precision", "bf16" if typ in ("bfloat16", "bf16") else "fp16", m.origin("fp16"))
        return
    f.set("precision", "fp32", "NeoX default (no fp16/bf16 section)")
