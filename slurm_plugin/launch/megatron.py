"""Megatron-LM and Megatron-DeepSpeed command-line arguments -> facts.

Flag meanings differ by fork (docs/launch-config-keys.md §4): ``--checkpoint-activations`` is
full recompute in Megatron-DeepSpeed (and old Megatron-LM) while ``--recompute-activations`` is
*selective*; GQA is ``--num-key-value-heads`` (Megatron-DeepSpeed) or ``--group-query-attention
--num-query-groups`` (Megatron-LM); the distributed optimizer shards optimizer state like ZeRO-1.
Parsers there use ``allow_abbrev=False`` and argparse keeps the last of repeated flags; a flag its
parser does not know stops Megatron at start (:func:`check_flags`, with the flag list of megatron_flags.py).
"""
from __future__ import annotations

import ast
import difflib
from typing import Any, Optional

from predictor.recipe import gated_ffn_width

from . import moe
from .configs import to_int
from .facts import Facts
from .limits import MAX_KEY_SUGGESTIONS, CannotPredict
from .megatron_flags import KNOWN as KNOWN_FLAGS
from .megatron_flags import MEGATRON_LM_SOURCE
from .neox_keys import CONTIGUOUS_NEEDS_PARTITION, suggest
from .overlap import set_overlaps, warn_overlaps
from .values import MARK_OPEN

_INT = {
    "--num-layers": "layers", "--hidden-size": "hidden", "--num-attention-heads": "heads",
    "--ffn-hidden-size": "ffn_hidden", "--seq-length": "seq_len", "--encoder-seq-length": "seq_len",
    "--micro-batch-size": "micro_batch", "--global-batch-size": "global_batch",
    "--tensor-model-parallel-size": "tp", "--model-parallel-size": "tp",
    "--pipeline-model-parallel-size": "pp", "--context-parallel-size": "cp",
    "--ds-sequence-parallel-size": "ds_sp", "--train-iters": "train_iters", "--train-samples": "train_samples",
    "--train-tokens": "train_tokens", "--eval-interval": "eval_interval", "--eval-iters": "eval_iters",
    "--save-interval": "save_interval", "--persistent-save-interval": "save_interval",
    "--exit-interval": "exit_interval", "--exit-duration-in-mins": "exit_duration",
    "--num-layers-per-virtual-pipeline-stage": "layers_per_vstage",
    "--num-virtual-stages-per-pipeline-rank": "virtual_stages",
    "--make-vocab-size-divisible-by": "vocab_divisible", "--pad-vocab-size-to": "padded_vocab",
    "--vocab-size": "vocab", "--zero-stage": "cli_zero_stage", "--num-query-groups": "num_query_groups",
    "--num-key-value-heads": "kv_heads_ms", "--max-position-embeddings": "max_pos",
    "--checkpoint-num-layers": "checkpoint_num_layers", "--recompute-num-layers": "recompute_num_layers",
    "--decoder-first-pipeline-num-layers": "first_stage_layers",
    "--decoder-last-pipeline-num-layers": "last_stage_layers",
}
_STR = {
    "--recompute-granularity": "recompute_granularity", "--normalization": "norm_raw",
    "--position-embedding-type": "pos_raw", "--tokenizer-type": "tokenizer", "--tokenizer-model": "tokenizer_model",
    "--tokenizer-name-or-path": "tokenizer_model", "--vocab-file": "vocab_file",
    "--attention-backend": "attention_backend", "--glu-activation": "glu", "--fp8-format": "fp8",
    "--fp8-recipe": "fp8_recipe_raw",
    "--deepspeed_config": "ds_config", "--deepspeed-config": "ds_config", "--deepscale_config": "ds_config",
    "--split": "split", "--save": "save_dir", "--recompute-method": "recompute_method",
    "--window-size": "window_size_raw", "--window-attn-skip-freq": "window_skip_raw",
}
_FLAGS = {
    "--recompute-activations": "recompute_activations", "--checkpoint-activations": "checkpoint_activations",
    "--deepspeed-activation-checkpointing": "ds_act_ckpt", "--use-flash-attn": "flash",
    "--use-flash-attn-v1": "flash", "--use-flash-attn-v2": "flash", "--use-flash-attn-triton": "flash_triton",
    "--swiglu": "swiglu", "--untie-embeddings-and-output-weights": "untie", "--bf16": "bf16", "--fp16": "fp16",
    "--deepspeed": "deepspeed", "--deepscale": "deepspeed", "--use-distributed-optimizer": "dist_opt",
    "--sequence-parallel": "sequence_parallel", "--group-query-attention": "gqa",
    "--no-pipeline-parallel": "no_pp", "--use-rotary-position-embeddings": "rotary_ms",
    "--no-position-embedding": "no_pos", "--no-masked-softmax-fusion": "no_softmax_fusion",
    "--use-mcore-models": "mcore", "--transformer-impl": "transformer_impl",
    "--account-for-embedding-in-pipeline-split": "account_for_embedding",
    "--account-for-loss-in-pipeline-split": "account_for_loss",
    "--tp-comm-overlap": "tp_comm_raw", "--overlap-grad-reduce": "overlap_grad_raw",
    "--overlap-param-gather": "overlap_param_raw", "--grad-reduce-in-bf16": "grad_reduce_bf16",
    "--accumulate-allreduce-grads-in-fp32": "grad_reduce_fp32",
    "--partition-activations": "cli_partition_activations", "--checkpoint-in-cpu": "cli_checkpoint_in_cpu",
    "--synchronize-each-layer": "cli_synchronize_each_layer",
    "--contigious-checkpointing": "cli_contiguous_checkpointing",
    "--distribute-saved-activations": "distribute_saved",
    "--disable-bias-linear": "disable_bias_linear", "--add-qkv-bias": "add_qkv_bias",
}
_NARGS = {"--rampup-batch-size": ("rampup", 3)}


def read_args(args: list, facts: Facts) -> list[tuple[str, str]]:
    """Fill raw Megatron facts from the training script's arguments; the flags it does not read,
    each ``(flag, origin)``, are returned for :func:`check_flags`."""
    i, n = 0, len(args)
    hidden = []
    unread: list[tuple[str, str]] = []
    while i < n:
        tok = args[i]
        t = tok.text
        if MARK_OPEN in t and not t.startswith("--"):
            hidden.append(facts.u.reason(t) or "unknown")
            i += 1
            continue
        if not t.startswith("--"):
            i += 1
            continue
        name, eq, _val = t.partition("=")
        if eq:
            val_tok, off, step = tok, len(name) + 1, 1
        elif i + 1 < n:
            val_tok, off, step = args[i + 1], 0, 2
        else:
            val_tok, off, step = None, 0, 1
        if name == "--num-experts":
            # Megatron-DeepSpeed takes a list (nargs='+', one count per expert layer group)
            i += 1
            vals = []
            if eq:
                vals.append((val_tok.text[off:], val_tok.origin_at(off)))
            else:
                while i < n and not args[i].text.startswith("--"):
                    vals.append((args[i].text, args[i].origin_at(0)))
                    i += 1
            counts = [moe.experts(v) for v, _ in vals]
            hidden_n = next(((v, o) for v, o in vals if MARK_OPEN in v), None)
            if hidden_n is not None:
                facts.set_unknown("num_experts", facts.u.reason(hidden_n[0]) or "unknown", hidden_n[1])
            elif vals:
                most = max(range(len(vals)), key=lambda k: counts[k])
                facts.set("num_experts", counts[most], vals[most][1])
            continue
        if name.startswith("--moe-") or name == "--expert-model-parallel-size":
            if facts.get("moe_flag") is None:
                facts.set("moe_flag", name, tok.origin_at(0))
        int_key = _INT.get(name)
        if int_key is not None:
            if val_tok is None:
                i += 1
                continue
            facts.set_int(int_key, val_tok, off, what=name)
            i += step
        elif name in _STR:
            if val_tok is None:
                i += 1
                continue
            if _STR[name] == "ds_config":
                # a path: keep unknown parts, the script may have written the file under that name
                facts.set("ds_config", val_tok.text[off:], val_tok.origin_at(off))
            else:
                facts.set_str(_STR[name], val_tok, off)
            i += step
        elif name in _FLAGS:
            facts.set(_FLAGS[name], True, tok.origin_at(0))
            i += 1
        elif name in _NARGS:
            key, k = _NARGS[name]
            vals = args[i + 1:i + 1 + k]
            if len(vals) == k:
                sub = Facts(facts.u)
                for j, v in enumerate(vals):
                    sub.set_int(str(j), v, what=name)
                if all(sub.known(str(j)) for j in range(k)):
                    facts.set(key, tuple(sub.val(str(j)) for j in range(k)), vals[0].origin_at(0))
                else:
                    bad = next(sub.get(str(j)) for j in range(k) if not sub.known(str(j)))
                    facts.set_unknown(key, bad.unknown or "unknown", bad.origin)
            i += 1 + k
        else:
            # unknown flag: skip its value(s) too (anything up to the next --flag); an unknown
            # value right after it is that flag's value, later ones may be hidden arguments
            if MARK_OPEN not in name:
                unread.append((name, tok.origin_at(0)))
            i += 1
            first = True
            while i < n and not args[i].text.startswith("--") and not eq:
                if MARK_OPEN in args[i].text and not first:
                    hidden.append(facts.u.reason(args[i].text) or "unknown")
                first = False
                i += 1
    if hidden:
        facts.hidden_args = hidden[0]
    return unread


# Flags whose value this reader uses: a misspelling of one predicts another job.
_READ_FLAGS = frozenset(_INT) | frozenset(_STR) | frozenset(_FLAGS) | frozenset(_NARGS) | {"--num-experts"}
_READ_NAMES = frozenset(f[2:] for f in _READ_FLAGS)
_KNOWN_NAMES = frozenset(f[2:] for f in KNOWN_FLAGS)
# Look-ups in the whole flag list (for a warning's did-you-mean) are the dear ones: the first few
# unknown flags get one; every unknown flag is still checked against the flags the reader uses.
MAX_FLAG_HINTS = 4


def _close_flag(flag: str, names: frozenset) -> Optional[str]:
    """The flag of ``names`` that ``flag`` most likely misspells (underscores for dashes, a prefix, a typo)."""
    dashed = flag.replace("_", "-")
    if dashed != flag and dashed[2:] in names:
        return dashed
    guess = suggest(flag[2:], names)
    return "--" + guess if guess else None


def check_flags(unread: list, warnings: list, deepspeed: bool) -> None:
    """Megatron's argparse (allow_abbrev=False) refuses a flag it does not know and the job stops at
    start. A likely misspelling of a flag this reader uses stops the prediction; any other unknown
    flag is a warning (a training script may add flags of its own, which no list can hold)."""
    unknown = 0
    for flag, origin in unread:
        if flag in KNOWN_FLAGS:
            continue
        unknown += 1
        if unknown > MAX_KEY_SUGGESTIONS:
            continue
        guess = _close_flag(flag, _READ_NAMES)
        if guess is not None:
            raise CannotPredict(f"{flag} is not a Megatron argument; did you mean {guess}? Megatron will "
                                f"refuse this flag at start, and without it the job would be a different one",
                                origin)
        guess = _close_flag(flag, _KNOWN_NAMES) if unknown <= MAX_FLAG_HINTS else None
        if guess:
            warnings.append(f"{flag} is not a Megatron argument: Megatron will refuse this flag at start; "
                            f"did you mean {guess}? ({origin})")
        elif not deepspeed:
            warnings.append(f"{flag} is not a Megatron-LM argument ({MEGATRON_LM_SOURCE}): Megatron will "
                            f"refuse this flag at start unless the training script adds it ({origin})")
    if unknown > MAX_KEY_SUGGESTIONS:
        warnings.append(f"{unknown - MAX_KEY_SUGGESTIONS} more flags that are not Megatron arguments")


def check_moe(facts: Facts) -> None:
    """Refuse a mixture-of-experts launch (``--num-experts N`` > 1, or ``--moe-*`` options alone)."""
    ne = facts.get("num_experts")
    if ne is not None and ne.unknown is not None:
        raise CannotPredict(f"--num-experts is unknown ({ne.unknown}): a mixture-of-experts model cannot be "
                            f"ruled out", ne.origin)
    if ne is not None and (ne.value or 0) > 1:
        moe.refuse(f"--num-experts {ne.value}", ne.origin)
    flag = facts.get("moe_flag")
    if flag is not None:
        if ne is None:
            moe.refuse(flag.value, flag.origin)
        facts.warnings.append(f"{flag.value} ignored: --num-experts {ne.value} is a dense model ({flag.origin})")


# Flags of choices (megatron/training/arguments.py): argparse refuses any other value at start.
# --attention-backend is AttnBackend[value] (megatron/core/transformer/enums.py), case and all;
# --normalization is LayerNorm|RMSNorm in Megatron-LM and lower case in older forks: either case.
# --recompute-granularity: choices=['full', 'selective'] (Megatron-LM; Megatron-DeepSpeed's merged
# parser alike).  --position-embedding-type: Megatron-LM's choices (learned_absolute, rope, mrope,
# relative, none; a fork adds alibi); Megatron-DeepSpeed's (bigscience) is PositionEmbeddingType[x]
# of megatron/model/enums.py (absolute, rotary, alibi).  --glu-activation: bigscience
# Megatron-DeepSpeed's GLU_ACTIVATIONS (megatron/model/glu_activations.py).
# (fact, flag, choices, choices under Megatron-DeepSpeed as well, any case)
_POS_LM = ("learned_absolute", "rope", "mrope", "relative", "none")
_POS_DS = ("absolute", "rotary", "alibi")
GLU_ACTIVATIONS = ("geglu", "liglu", "reglu", "swiglu")
_CHOICES = (("attention_backend", "--attention-backend", ("flash", "fused", "unfused", "local", "auto"), (), False),
            ("norm_raw", "--normalization", ("LayerNorm", "RMSNorm"), (), True),
            ("fp8", "--fp8-format", ("e4m3", "hybrid"), (), False),
            ("recompute_granularity", "--recompute-granularity", ("full", "selective"), (), False),
            ("pos_raw", "--position-embedding-type", _POS_LM, _POS_DS, False),
            ("glu", "--glu-activation", GLU_ACTIVATIONS, (), False))


def check_choices(facts: Facts, deepspeed: bool = False) -> None:
    """A value Megatron's argparse refuses stops the prediction, as a flag it refuses does.  A
    value of the other family's choices (Megatron-DeepSpeed's ``rotary`` under Megatron-LM) is
    let through: forks carry either."""
    for key, flag, lm_choices, ds_choices, any_case in _CHOICES:
        value = facts.val(key)
        if not isinstance(value, str) or MARK_OPEN in value or value in lm_choices or value in ds_choices:
            continue
        if any_case and value.lower() in (c.lower() for c in lm_choices):
            continue
        choices = lm_choices + ds_choices if deepspeed else lm_choices
        guess = difflib.get_close_matches(value, choices, n=1) or \
            difflib.get_close_matches(value.lower(), [c.lower() for c in choices], n=1)
        if guess and guess[0] not in choices:
            guess = [next(c for c in choices if c.lower() == guess[0])]
        near = f"; did you mean {guess[0]}?" if guess else ""
        raise CannotPredict(f"{flag} {value}: not one of Megatron's choices ({', '.join(choices)}); Megatron will "
                            f"refuse this value at start{near}", facts.origin(key))


def check_asserts(f: Facts) -> None:
    """Combinations that Megatron's ``validate_args`` asserts against, so the job stops at start
    (the same checks in Megatron-LM's megatron/training/arguments.py and Megatron-DeepSpeed's
    megatron/arguments.py)."""
    if f.val("bf16") and f.val("fp16"):
        raise CannotPredict("--fp16 with --bf16: Megatron's validate_args asserts only one of them (`if args.fp16: "
                            "assert not args.bf16`) and the job stops at start", f.origin("fp16"))
    if f.val("train_iters") and f.get("train_samples") is not None:
        raise CannotPredict("--train-iters with --train-samples: Megatron's validate_args asserts iteration- or "
                            "sample-based training, not both ('expected iteration-based training'), and the job "
                            "stops at start", f.origin("train_samples"))
    if f.get("rampup") is not None and f.get("train_iters") is not None:
        # validate_args: "expected no batch-size rampup for iteration-based training".
        raise CannotPredict("--rampup-batch-size with --train-iters: Megatron asserts there is no batch-size "
                            "rampup in iteration-based training and stops at start (--train-samples takes a "
                            "rampup)", f.origin("rampup"))
    seq, max_pos = f.val("seq_len"), f.val("max_pos")
    if isinstance(seq, int) and isinstance(max_pos, int) and max_pos < seq:
        # Megatron-LM asserts it whatever the position embedding; Megatron-DeepSpeed too (bigscience's
        # fork for absolute / alibi positions, and refuses --max-position-embeddings with rotary ones)
        raise CannotPredict(f"--max-position-embeddings {max_pos} is below the sequence length {seq} "
                            f"({f.origin('seq_len')}): Megatron's validate_args asserts max_position_embeddings "
                            f">= seq_length and the job stops at start", f.origin("max_pos"))


def derive_model(facts: Facts, deepspeed: bool) -> None:
    """Framework rules -> the model/layout facts that derive.py expects (in place)."""
    f = facts
    w = f.warnings
    check_choices(f, deepspeed)
    check_asserts(f)
    _sequence_parallel_at_tp1(f)
    _null_tokenizer(f)
    # GQA
    if f.val("gqa"):
        f.set("kv_heads", f.val("num_query_groups", 1), f.origin("num_query_groups", f.origin("gqa")))
    elif f.get("kv_heads_ms") is not None:
        f.d["kv_heads"] = f.d["kv_heads_ms"]
    elif f.get("num_query_groups") is not None and not deepspeed:
        w.append("--num-query-groups without --group-query-attention is ignored by Megatron-LM")
    # FFN
    gated = bool(f.val("swiglu")) or f.val("glu") in GLU_ACTIVATIONS
    if f.get("ffn_hidden") is None and f.known("hidden"):
        # Megatron-LM's --swiglu takes 2/3 of 4h; Megatron-DeepSpeed's --glu-activation keeps 4h
        h = f.val("hidden")
        ffn = gated_ffn_width(h, "megatron") if f.val("swiglu") else 4 * h
        f.set("ffn_hidden", ffn, f.origin("swiglu", f.origin("hidden")))
    if gated:
        if f.val("glu") not in (None, "swiglu"):
            # ParallelMLP: dense_h_to_4h gives 2 × ffn-hidden-size for every GLU, one half gating
            # the other; only the gate's element-wise function differs from SwiGLU's SiLU
            w.append(f"--glu-activation {f.val('glu')} is modelled as swiglu (a gated MLP of the same shapes; "
                     f"{_GLU_GATE[f.val('glu')]} in place of SiLU on the gate is not costed apart) "
                     f"({f.origin('glu')})")
        f.set("activation", "swiglu", f.origin("swiglu", f.origin("glu")))
    else:
        f.set("activation", "gelu", "Megatron default")
    # norm
    norm = (f.val("norm_raw") or "layernorm").lower()
    f.set("norm", "rmsnorm" if "rms" in norm else "layernorm", f.origin("norm_raw", "Megatron default"))
    # positions
    pos = f.val("pos_raw")
    if pos is not None:
        mapped = {"learned_absolute": "learned", "absolute": "learned", "rope": "rotary", "rotary": "rotary",
                  "mrope": "rotary", "alibi": "alibi", "none": "none"}.get(pos)
        if mapped is None:
            # "relative" (check_choices lets no other value through): T5-style buckets as an attention bias
            w.append(f"--position-embedding-type {pos} (a learned relative-position bias on the attention "
                     f"scores) is modelled as none: the bias is not costed ({f.origin('pos_raw')})")
            mapped = "none"
        f.set("pos_emb", mapped, f.origin("pos_raw"))
    elif f.val("rotary_ms"):
        f.set("pos_emb", "rotary", f.origin("rotary_ms"))
    elif f.val("no_pos"):
        f.set("pos_emb", "none", f.origin("no_pos"))
    else:
        f.set("pos_emb", "learned", "Megatron default")
    # attention kernel
    backend = (f.val("attention_backend") or "").lower()
    if f.val("flash_triton"):
        # Megatron-DeepSpeed's --use-flash-attn-triton: the Triton FlashAttention kernel
        f.set("attention", "flash", f.origin("flash_triton"))
        f.set("attention_impl", "triton", f.origin("flash_triton"))
    elif f.val("flash") or backend == "flash":
        # --use-flash-attn (the flash_attn package) and TE's flash backend: FlashAttention-2
        f.set("attention", "flash", f.origin("flash", f.origin("attention_backend")))
        f.set("attention_impl", "flash2", f.origin("flash", f.origin("attention_backend")))
    elif backend == "fused":
        # Transformer Engine's FusedAttention is cuDNN's fused attention
        f.set("attention", "flash", f.origin("attention_backend"))
        f.set("attention_impl", "cudnn", f.origin("attention_backend"))
    elif backend in ("unfused", "local"):
        f.set("attention", "unfused", f.origin("attention_backend"))
    elif f.val("no_softmax_fusion"):
        f.set("attention", "unfused", f.origin("no_softmax_fusion"))
    elif not deepspeed and (backend == "auto" or f.val("transformer_impl", "transformer_engine")
                            == "transformer_engine") and f.val("mcore", True):
        # Megatron-LM's default backend 'auto' lets Transformer Engine pick; on current GPUs that is
        # a flash/cuDNN fused attention kernel.
        f.set("attention", "flash", "Megatron-LM default (--attention-backend auto)")
        if not te_backend_from_env(f):
            w.append("attention kernel: Megatron-LM's --attention-backend auto is assumed to pick flash attention")
    else:
        f.set("attention", "fused_softmax", "Megatron default")
    _window(f)
    f.set("tied_embeddings", not f.val("untie"), f.origin("untie", "Megatron default"))
    f.set("parallel_residual", False, "Megatron default")
    _linear_bias(f)
    # precision
    if f.val("fp8"):
        # FP8 runs on top of bf16 (Transformer Engine): the layers' linear GEMMs in FP8, all else
        # in bf16.  Megatron's --fp8-recipe (default delayed): tensorwise, blockwise and mxfp8
        # scale each tensor from itself, one more read of it (run.fp8 "current").
        raw = str(f.val("fp8_recipe_raw") or "delayed").lower()
        recipe = "delayed" if raw == "delayed" else "current"
        if raw not in ("delayed", "tensorwise", "blockwise", "mxfp8"):
            w.append(f"--fp8-recipe {raw}: not a recipe perfcast knows; costed as current scaling")
        f.set("fp8_recipe", recipe, f.origin("fp8_recipe_raw", "Megatron default (--fp8-recipe delayed)"))
        f.set("precision", "bf16", f.origin("fp8"))
    elif f.val("bf16"):
        f.set("precision", "bf16", f.origin("bf16"))
    elif f.val("fp16"):
        f.set("precision", "fp16", f.origin("fp16"))
    else:
        f.set("precision", "fp32", "Megatron default (no --fp16/--bf16)")
    # recompute
    gran = f.val("recompute_granularity") or ""      # full | selective: check_choices stops on another
    if f.val("checkpoint_activations"):
        if not deepspeed:
            w.append("--checkpoint-activations: recent Megatron-LM rejects it (it stops at start-up); "
                     "read as full recompute like older versions")
        f.set("recompute", "full", f.origin("checkpoint_activations"))
    elif gran in ("full", "selective"):
        f.set("recompute", gran, f.origin("recompute_granularity"))
        if gran == "full":
            _partial_recompute(f)
    elif f.val("recompute_activations"):
        f.set("recompute", "selective", f.origin("recompute_activations"))
    else:
        f.set("recompute", "none", "Megatron default")
    if deepspeed:
        _checkpoint_options(f)
    elif f.val("distribute_saved"):
        _distribute_saved(f)
    # pipeline
    if f.val("no_pp"):
        f.set("pp", 1, f.origin("no_pp"))
    if f.known("layers_per_vstage") and f.known("layers"):
        pp = f.val("pp", 1)
        lpv = f.val("layers_per_vstage")
        if lpv > 0 and pp > 0 and f.val("layers") % (pp * lpv) == 0:
            f.set("virtual_stages", f.val("layers") // pp // lpv, f.origin("layers_per_vstage"))
        else:
            w.append("--num-layers-per-virtual-pipeline-stage does not divide the layers per stage")
    _pipeline_split(f, deepspeed)
    found = {kind: f"{flag} ({f.origin(fact)})" for kind, fact, flag in _OVERLAPS if f.val(fact)}
    if deepspeed:
        warn_overlaps(f, found)      # Megatron-core's DDP options; DeepSpeed's engine reduces gradients itself
    else:
        set_overlaps(f, found, bool(f.val("dist_opt")), bool(f.val("sequence_parallel")))
        _grad_precision(f)
    # context / Ulysses parallelism divide DP
    if deepspeed and f.get("ds_sp") is not None:
        f.d["cp"] = f.d["ds_sp"]
    # optimizer sharding
    if not deepspeed:
        f.set("zero_stage", 1 if f.val("dist_opt") else 0, f.origin("dist_opt", "Megatron default"))
    elif f.val("dist_opt"):
        f.set("dist_opt_stage", 1, f.origin("dist_opt"))
    # evaluation off by split
    split = f.val("split")
    if isinstance(split, str):
        parts = [p.strip() for p in split.replace("/", ",").split(",")]
        if len(parts) >= 2:
            try:
                if float(parts[1]) == 0:
                    f.set("eval_iters", 0, f.origin("split"))
            except ValueError:
                pass
    # checkpoints only when there is somewhere to save them
    if f.get("save_interval") is not None and f.get("save_dir") is None:
        f.set("save_interval", 0, f.origin("save_interval"))
        w.append("--save-interval without --save: no checkpoints are written")
    # Megatron defaults for evaluation cadence
    if f.get("eval_interval") is None:
        f.set("eval_interval", 1000, "Megatron default")
    if f.get("eval_iters") is None:
        f.set("eval_iters", 100, "Megatron default")


def _sequence_parallel_at_tp1(f: Facts) -> None:
    """Megatron's validate_args turns sequence parallelism off at tensor-parallel size 1
    (``if args.tensor_model_parallel_size == 1: args.sequence_parallel = False``, with the warning
    "Disabling sequence parallelism because tensor model parallelism is disabled")."""
    if not f.val("sequence_parallel"):
        return
    tp = f.get("tp")
    if tp is not None and (tp.unknown is not None or tp.value != 1):
        return
    where = f.origin("sequence_parallel")
    size = f"tensor-parallel size 1 ({tp.origin})" if tp is not None else "no --tensor-model-parallel-size"
    f.set("sequence_parallel", False, f"{where} (turned off by Megatron at tensor-parallel size 1)")
    f.warnings.append(f"--sequence-parallel with {size}: Megatron turns sequence parallelism off at "
                      f"tensor-parallel size 1; read as off ({where})")


def _null_tokenizer(f: Facts) -> None:
    """Megatron's NullTokenizer appends an end-of-document token: its vocab_size is --vocab-size + 1
    (``_NullTokenizer.vocab_size``), which Megatron then pads."""
    if f.val("tokenizer") != "NullTokenizer" or not f.known("vocab"):
        return
    n = f.val("vocab")
    f.set("vocab", n + 1, f"{f.origin('vocab')} (--tokenizer-type NullTokenizer: --vocab-size {n} + 1, its "
                          f"end-of-document token)")


def _linear_bias(f: Facts) -> None:
    """Megatron's linear layers carry biases (add_bias_linear) unless --disable-bias-linear;
    --add-qkv-bias puts them back on the QKV projection alone."""
    if f.val("disable_bias_linear"):
        f.set("linear_bias", False, f.origin("disable_bias_linear"))
        if f.val("add_qkv_bias"):
            f.warnings.append(f"--add-qkv-bias with --disable-bias-linear: the QKV projection's biases "
                              f"(a few thousand parameters per layer) are not counted ({f.origin('add_qkv_bias')})")
    else:
        f.set("linear_bias", True, "Megatron default (biases on the linear layers without --disable-bias-linear)")


def window_pair(raw: Any, what: str, origin: str, brackets: bool = False) -> Optional[tuple]:
    """Megatron-core's ``window_size`` (left, right) as written: ``--window-size 4096,0`` (Megatron's
    tuple_type: ``"4096,0"`` or ``"(4096,0)"``) or, with ``brackets``, a YAML list / ``[4096,0]``
    (NeMo's model.window_size).  None for null; a value that is not two integers stops the job
    when Megatron-core builds the attention, and the prediction here."""
    if raw is None:
        return None
    if isinstance(raw, (list, tuple)) and brackets:
        parts: list = list(raw)
    else:
        text = str(raw).strip()
        if brackets and text.lower() in ("null", "none", "~"):
            return None
        parts = text.strip("()[]" if brackets else "()").split(",")
    nums = [None if isinstance(p, bool) else to_int(p.strip() if isinstance(p, str) else p) for p in parts]
    if len(nums) != 2 or any(n is None for n in nums):
        raise CannotPredict(f"{what} {str(raw)[:40]}: not a pair LEFT,RIGHT of integers (Megatron-core's "
                            f"window_size is (left, right)); the job stops when it builds the attention", origin)
    return nums[0], nums[1]


def window_layers(raw: Any, layers: Optional[int]) -> Optional[str]:
    """Which layers a ``window_attn_skip_freq`` leaves windowed (megatron/core/transformer/utils.py
    ``is_layer_window_attention``: an integer N makes layers N, 2N, … full attention; a list, as
    ``"[1,1,1,0]*3"``, gives each layer 1 = window, 0 = full): "all", "none", "some", or None when
    it cannot be read."""
    if raw is None:
        return "all"
    if isinstance(raw, (list, tuple)):
        pattern: Any = list(raw)
    else:
        text = str(raw).strip()
        if "[" not in text:
            n = to_int(text)
            if n is None or n < 1:
                return None
            if n == 1:
                return "none"
            return "all" if layers is not None and n > layers else "some"
        body, star, times = text.partition("*")
        try:
            pattern = ast.literal_eval(body.strip())
            k = int(times.strip()) if star else 1
        except (ValueError, SyntaxError, TypeError):
            return None
        if not isinstance(pattern, list) or k < 1:
            return None
    if not pattern or not all(isinstance(x, int) and not isinstance(x, bool) for x in pattern):
        return None
    on = {bool(x) for x in pattern}
    return "all" if on == {True} else "none" if on == {False} else "some"


def set_window(f: Facts, pair: tuple, what: str, origin: str, skip: Any = None, skip_what: str = "",
               skip_origin: str = "") -> None:
    """The job's ``model.attention_window`` from Megatron-core's (left, right) window: a query
    keeps the keys i − left … i + right (``get_sliding_window_causal_mask``; -1 = unbounded),
    so under GPT's causal mask it meets left + 1 keys.  With ``skip`` (window_attn_skip_freq) some
    layers may run full attention: the job has one window for every layer, so those jobs are
    costed as full attention everywhere (an upper bound), with a warning."""
    left, right = pair
    shown = f"{what} {left},{right}"
    if left == -1:
        f.warnings.append(f"{shown}: a left window of -1 is unbounded, so attention is full causal ({origin})")
        return
    if left < 1:
        raise CannotPredict(f"{shown}: a window of {left} tokens before each query is not a sliding window "
                            f"(at least 1; -1 = unbounded)", origin)
    if right > 0:
        f.warnings.append(f"{shown}: GPT's causal mask keeps no key after the query, so the right side "
                          f"({right}) is 0 ({origin})")
    layers = f.val("layers") if f.known("layers") else None
    which = window_layers(skip, layers)
    if which != "all":
        how = {"none": "every layer runs full attention",
               "some": "some layers run full attention, which is not costed beside windowed ones",
               None: "not a frequency or pattern this reader can evaluate"}[which]
        tail = "" if which == "none" else "; every layer costed as full causal attention (an upper bound)"
        f.warnings.append(f"{skip_what} {str(skip)[:40]} with {shown}: {how}{tail} ({skip_origin})")
        return
    window = left + 1
    f.set("attention_window", window, f"{origin} ({shown}: {window} keys per query)")


def _window(f: Facts) -> None:
    """--window-size LEFT,RIGHT (and --window-attn-skip-freq): sliding-window attention."""
    raw = f.get("window_size_raw")
    skip = f.get("window_skip_raw")
    if raw is None:
        if skip is not None:
            f.warnings.append(f"--window-attn-skip-freq without --window-size does nothing ({skip.origin})")
        return
    if raw.unknown is not None:
        f.set_unknown("attention_window", raw.unknown, raw.origin)
        return
    pair = window_pair(raw.value, "--window-size", raw.origin)
    if pair is None:
        return
    if skip is not None and skip.unknown is not None:
        f.warnings.append(f"--window-attn-skip-freq is unknown ({skip.unknown}): every layer costed as full "
                          f"causal attention (an upper bound) ({skip.origin})")
        return
    set_window(f, pair, "--window-size", raw.origin, skip.value if skip is not None else None,
               "--window-attn-skip-freq", skip.origin if skip is not None else "")


def te_backend_from_env(f: Facts) -> bool:
    """Transformer Engine's own choice under ``--attention-backend auto`` (and NeMo's mcore models),
    narrowed by the environment the launch exports (``env_nvte_flash`` / ``env_nvte_fused``, from
    NVTE_FLASH_ATTN / NVTE_FUSED_ATTN): flash off -> cuDNN's fused attention, fused off ->
    FlashAttention-2, both off -> TE's unfused attention. True when the environment decided."""
    flash, fused = f.get("env_nvte_flash"), f.get("env_nvte_fused")
    flash_off = flash is not None and flash.value == "0"
    fused_off = fused is not None and fused.value == "0"
    if flash_off and fused_off:
        origin = f"{flash.origin} (NVTE_FLASH_ATTN=0, NVTE_FUSED_ATTN=0)"
        f.set("attention", "unfused", origin)
        f.d.pop("attention_impl", None)
        f.warnings.append(f"NVTE_FLASH_ATTN=0 and NVTE_FUSED_ATTN=0: Transformer Engine runs unfused attention "
                          f"({flash.origin})")
        return True
    if flash_off:
        f.set("attention", "flash", f"{flash.origin} (NVTE_FLASH_ATTN=0)")
        f.set("attention_impl", "cudnn", f"{flash.origin} (NVTE_FLASH_ATTN=0: TE's cuDNN fused attention)")
        return True
    if fused_off:
        f.set("attention", "flash", f"{fused.origin} (NVTE_FUSED_ATTN=0)")
        f.set("attention_impl", "flash2", f"{fused.origin} (NVTE_FUSED_ATTN=0: TE's FlashAttention backend)")
        return True
    return False


def env_facts(f: Facts, env: dict, where: str) -> None:
    """The launch's NVTE_FLASH_ATTN / NVTE_FUSED_ATTN (Transformer Engine's backend switches)."""
    for name, key in (("NVTE_FLASH_ATTN", "env_nvte_flash"), ("NVTE_FUSED_ATTN", "env_nvte_fused")):
        v = env.get(name)
        if isinstance(v, str) and v.strip() in ("0", "1") and MARK_OPEN not in v:
            f.set(key, v.strip(), f"{where} (environment {name})")


# Megatron-DeepSpeed's flags to deepspeed.checkpointing.configure (setup_deepspeed_random_and_
# activation_checkpointing), the DeepSpeed JSON's option each overrides, and the layout key.
_CHECKPOINT_FLAGS = (("--partition-activations", "cli_partition_activations", "partition_activations",
                      "ds_partition_activations", "partition_activations"),
                     ("--checkpoint-in-cpu", "cli_checkpoint_in_cpu", "cpu_checkpointing",
                      "ds_cpu_checkpointing", "checkpoint_in_cpu"),
                     ("--synchronize-each-layer", "cli_synchronize_each_layer", "synchronize_checkpoint_boundary",
                      "ds_synchronize_checkpoint_boundary", "checkpoint_sync_each_layer"))


def _checkpoint_options(f: Facts) -> None:
    """DeepSpeed's activation-checkpointing options under Megatron-DeepSpeed.

    Only with ``--deepspeed-activation-checkpointing`` do the layers go through DeepSpeed's
    checkpoint function, configured from the flags; each flag is passed as a bool, so an absent
    one overrides the DeepSpeed JSON's ``activation_checkpointing`` option (said when the JSON sets
    it).  They act on checkpointed layers only (a recompute granularity, or the older
    ``--checkpoint-activations``)."""
    w = f.warnings
    on = [(flag, fact, key) for flag, fact, _, _, key in _CHECKPOINT_FLAGS if f.val(fact)]
    overridden = [f"activation_checkpointing.{opt} ({f.origin(ds_fact)})"
                  for flag, fact, opt, ds_fact, _ in _CHECKPOINT_FLAGS if f.val(ds_fact) and not f.val(fact)]
    if f.val("ds_contiguous_checkpointing") and not f.val("cli_contiguous_checkpointing"):
        overridden.append(f"activation_checkpointing.contiguous_memory_optimization "
                          f"({f.origin('ds_contiguous_checkpointing')})")
    if overridden:
        w.append(f"{', '.join(overridden)}: Megatron-DeepSpeed configures DeepSpeed's checkpointing from its "
                 f"flags (--partition-activations, --checkpoint-in-cpu, --synchronize-each-layer, "
                 f"--contigious-checkpointing), absent ones as false, which override the config; not costed")
    if f.val("cli_contiguous_checkpointing") and not f.val("cli_partition_activations"):
        w.append(f"--contigious-checkpointing without --partition-activations: {CONTIGUOUS_NEEDS_PARTITION} "
                 f"({f.origin('cli_contiguous_checkpointing')})")
    if not on:
        return
    flags = ", ".join(flag for flag, _, _ in on)
    where = f.origin(on[0][1])
    if f.val("recompute") not in ("full", "selective"):
        w.append(f"{flags} without activation recomputation: DeepSpeed applies "
                 f"{'them' if len(on) > 1 else 'it'} to checkpointed layers only; not costed ({where})")
        return
    if not f.val("ds_act_ckpt"):
        w.append(f"{flags} without --deepspeed-activation-checkpointing: Megatron-DeepSpeed then checkpoints "
                 f"with its own function, which ignores {'them' if len(on) > 1 else 'it'}; not costed ({where})")
        return
    for _, fact, key in on:
        f.set(key, True, f.origin(fact))


def _distribute_saved(f: Facts) -> None:
    """Megatron-LM's ``--distribute-saved-activations``: each TP rank keeps 1/tp of a recomputed
    layer's input (``partition_activations`` under Megatron-core).  Megatron-LM's validate_args
    asserts tp > 1, ``--recompute-granularity full`` and a ``--recompute-method`` (the job stops
    at start without them), and Megatron-core turns it off under sequence parallelism."""
    where = f.origin("distribute_saved")
    tp = f.get("tp")
    # Releases that still take --checkpoint-activations turn it into granularity full, method
    # uniform inside validate_args, before that assertion.
    legacy = bool(f.val("checkpoint_activations"))
    needs = [need for need, missing in (
        ("--tensor-model-parallel-size above 1", tp is None or (tp.unknown is None and (tp.value or 1) <= 1)),
        ("--recompute-granularity full", f.val("recompute_granularity") != "full" and not legacy),
        ("a --recompute-method", f.get("recompute_method") is None and not legacy)) if missing]
    if needs:
        raise CannotPredict(f"--distribute-saved-activations needs {' and '.join(needs)}: Megatron-LM's "
                            f"validate_args asserts it and the job stops at start", where)
    if f.val("sequence_parallel"):
        f.warnings.append(f"--distribute-saved-activations with --sequence-parallel: Megatron-core turns it "
                          f"off ({where}); not costed")
    else:
        f.set("partition_activations", True, where)


def _partial_recompute(f: Facts) -> None:
    """--recompute-method / --recompute-num-layers under full granularity (Megatron-core semantics).

    uniform: every layer recomputed, in groups of N (same cost as full). block: only the first N
    layers of each stage recompute; the job model has no partial recompute, so that is costed as full.
    """
    method = (f.val("recompute_method") or "").lower()
    origin = f.origin("recompute_method", f.origin("recompute_granularity"))
    if not method:
        f.warnings.append("--recompute-granularity full without --recompute-method: Megatron-core requires "
                          f"uniform or block ({origin}); modelled as full recompute")
    elif method == "block" and f.known("recompute_num_layers"):
        f.warnings.append(f"--recompute-method block --recompute-num-layers {f.val('recompute_num_layers')}: "
                          f"recomputing only some layers per stage is modelled as full recompute ({origin})")
    elif method not in ("uniform", "block"):
        f.warnings.append(f"--recompute-method {method} is not uniform or block ({origin}); "
                          f"modelled as full recompute")


# The gate's function of each --glu-activation (glu_activations.py: F.gelu, F.relu, none, F.silu)
_GLU_GATE = {"geglu": "GELU", "reglu": "ReLU", "liglu": "no function (linear)", "swiglu": "SiLU"}

_OVERLAPS = (("tp", "tp_comm_raw", "--tp-comm-overlap"),
             ("grad", "overlap_grad_raw", "--overlap-grad-reduce"),
             ("param", "overlap_param_raw", "--overlap-param-gather"))


def _grad_precision(f: Facts) -> None:
    """Megatron-LM's gradient reduction precision where the arguments choose it: bf16 training
    reduces in fp32 unless --grad-reduce-in-bf16 (the predictor's default for Megatron-core);
    --accumulate-allreduce-grads-in-fp32 asks fp32 of fp16 training too."""
    if f.val("grad_reduce_bf16") and f.val("precision") == "bf16":
        f.set("grad_reduce_precision", "bf16", f.origin("grad_reduce_bf16"))
    elif f.val("grad_reduce_fp32") and f.val("precision") in ("fp16", "bf16"):
        f.set("grad_reduce_precision", "fp32", f.origin("grad_reduce_fp32"))

_SPLIT_OPTIONS = (("first_stage_layers", "--decoder-first-pipeline-num-layers"),
                  ("last_stage_layers", "--decoder-last-pipeline-num-layers"),
                  ("account_for_embedding", "--account-for-embedding-in-pipeline-split"),
                  ("account_for_loss", "--account-for-loss-in-pipeline-split"))


def _pipeline_split(f: Facts, deepspeed: bool) -> None:
    """The rule that splits the layers over pipeline stages (predictor.recipe.pipeline_split)."""
    given = [(fact, flag) for fact, flag in _SPLIT_OPTIONS if f.get(fact) is not None]
    if deepspeed:
        # Megatron-DeepSpeed hands its own layer list to DeepSpeed's PipelineModule
        # (partition_method type:transformer); the Megatron-LM options below are not its own.
        for fact, flag in given:
            f.warnings.append(f"{flag} is a Megatron-LM option; Megatron-DeepSpeed ignores it ({f.origin(fact)})")
            del f.d[fact]
        if f.val("pp", 1) > 1:
            f.warnings.append("pipeline split: Megatron-DeepSpeed's DeepSpeed partitioning "
                              "(type:transformer) is modelled by GPT-NeoX's (type:transformer|mlp)")
        return
    f.set("pipe_split", "megatron", "Megatron-LM rule (layers split evenly over the stages)")
    # No --pipeline-model-parallel-size is one stage; an unknown one is left to the job's check.
    pp = 1 if f.get("pp") is None else f.val("pp")
    if pp is not None and pp < 2:
        for fact, flag in given:
            if fact in ("first_stage_layers", "last_stage_layers"):
                f.warnings.append(f"{flag} has no effect with one pipeline stage ({f.origin(fact)})")
                del f.d[fact]
