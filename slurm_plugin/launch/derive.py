"""Facts + request + launcher -> the job dict of docs/job-file.md, with provenance and unresolved keys.

World size by launcher (pattern 9): torchrun/deepspeed count their own ranks (nnodes × nproc);
``srun python`` has one rank per task; NeoX's deepy.py takes global_num_gpus, else the hostfile,
else nodes × GPUs/node (pattern 32). dp = world / (pp·tp·cp). Iterations come from train_iters,
else train_samples (with Megatron's batch-size rampup loop), else train_tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from .facts import Facts
from .limits import MAX_RAMPUP_LEVELS
from .result import SlurmRequest
from .values import MARK_OPEN

DEFAULT_VOCAB = 50257

# (substring of tokenizer type / model / vocab file, lower case) -> unpadded vocabulary
KNOWN_TOKENIZERS = [
    ("20b_tokenizer", 50277), ("gpt-neox", 50277), ("pythia", 50277), ("neox", 50277),
    ("llama-3", 128256), ("llama3", 128256), ("codellama", 32016), ("llama-2", 32000), ("llama2", 32000),
    ("llama", 32000), ("mixtral", 32000), ("mistral", 32000), ("bloom", 250680), ("falcon", 65024),
    ("gemma", 256000), ("qwen2", 151643), ("t5", 32100), ("opt-", 50265),
    ("gpt2", 50257), ("charlevel", 512),
]
_BY_TYPE = {"gpt2bpetokenizer": 50257, "hfgpt2tokenizer": 50257, "charleveltokenizer": 512,
            "llama2tokenizer": 32000}

# run.framework values (predictor.job.FRAMEWORKS); "unknown" launches leave the key unset
_FRAMEWORKS = ("neox", "deepspeed", "megatron", "megatron-deepspeed", "nemo", "torchtitan", "llm-foundry")

CRITICAL = {"model.layers", "model.hidden", "model.heads", "model.seq_len", "layout.pp", "layout.tp",
            "layout.dp", "layout.micro_batch", "layout.micro_batches"}


# sizes that every framework rejects below 1 (and that we divide by)
# (the DeepSpeed config's keys by their own names in messages, not the reader's fact names)
_FACT_NAMES = {"ds_micro": "train_micro_batch_size_per_gpu", "ds_train_batch": "train_batch_size",
               "ds_gas": "gradient_accumulation_steps"}
_POSITIVE = ("layers", "hidden", "heads", "seq_len", "pp", "tp", "cp", "micro_batch", "global_batch",
             "grad_accum", "ds_micro", "ds_train_batch", "ds_gas", "kv_heads", "ffn_hidden", "virtual_stages")
# (fact, job key) copied as found
_MODEL_REQUIRED = tuple((k, f"model.{k}") for k in ("layers", "hidden", "heads", "seq_len"))
_MODEL_OPTIONAL = tuple((k, f"model.{k}") for k in ("norm", "activation", "attention", "pos_emb",
                                                     "parallel_residual", "tied_embeddings", "linear_bias",
                                                     "attention_window"))
_LAYOUT_OPTIONAL = tuple((k, f"layout.{k}") for k in (
    "recompute", "sequence_parallel", "virtual_stages",
    # the pipeline split: the framework's rule and its options (neox.py, megatron.py)
    "pipe_split", "first_stage_layers", "last_stage_layers", "account_for_embedding", "account_for_loss",
    # Megatron-core's overlapped communication (overlap.py)
    "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
    # DeepSpeed's activation-checkpointing options (neox.py, megatron.py)
    "partition_activations", "checkpoint_in_cpu", "checkpoint_sync_each_layer"))
_RUN_OPTIONAL = tuple((k, f"run.{k}") for k in ("eval_interval", "eval_iters", "save_interval"))


@dataclass
class World:
    gpus: Optional[int] = None
    origin: str = ""
    per_node: Optional[int] = None
    unknown: Optional[str] = None


@dataclass
class Derived:
    job_dict: dict = field(default_factory=lambda: {"model": {}, "layout": {}, "run": {}, "cluster": {}})
    provenance: dict = field(default_factory=dict)
    unresolved: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    error: Optional[tuple] = None          # (reason, where)
    exit_duration: Optional[int] = None

    def put(self, dotted: str, value: Any, origin: str) -> None:
        sec, _, key = dotted.partition(".")
        self.job_dict[sec][key] = value
        if origin:
            self.provenance[dotted] = origin

    def fail(self, reason: str, where: str = "") -> None:
        if self.error is None:
            self.error = (reason, where)


def rampup_iterations(train_samples: int, global_batch: int, start: int, incr: int, ramp_samples: int) -> int:
    """Megatron's update_train_iters for sample-based training with --rampup-batch-size.

    Rampup loop: while consumed <= ramp_samples: gbs = start + int(consumed / per_incr) * incr
    (capped at global); consumed += gbs; iters += 1. Then (train_samples - consumed) // global.
    Computed one batch-size level at a time so that huge sample counts cost nothing.
    """
    if incr <= 0 or start <= 0 or global_batch <= start:
        return train_samples // global_batch
    diff = global_batch - start
    if diff % incr:
        raise ValueError(f"global batch {global_batch} - start {start} is not a multiple of {incr}")
    num_incr = diff // incr
    if num_incr > MAX_RAMPUP_LEVELS:
        raise ValueError("too many batch-size rampup steps")
    per_incr = ramp_samples / num_incr
    consumed, iters = 0, 0
    level = 0
    while consumed <= ramp_samples:
        level = int(consumed / per_incr) if per_incr > 0 else num_incr
        gbs = min(start + level * incr, global_batch)
        if gbs >= global_batch:
            # capped: iterate at the full batch until the loop condition fails
            n = (ramp_samples - consumed) // gbs + 1
            consumed += n * gbs
            iters += n
            break
        # consumed stays at this level while int(consumed / per_incr) == level
        nxt = math.ceil((level + 1) * per_incr)
        while int(nxt / per_incr) <= level:
            nxt += 1
        while nxt > 0 and int((nxt - 1) / per_incr) > level:
            nxt -= 1
        limit = min(nxt, ramp_samples + 1)
        n = max(1, -(-(limit - consumed) // gbs))
        consumed += n * gbs
        iters += n
    # Megatron adds (train_samples - consumed) // global even when negative; a count stays >= 0
    return max(0, iters + (train_samples - consumed) // global_batch)


def rampup_iterations_slow(train_samples: int, global_batch: int, start: int, incr: int, ramp_samples: int) -> int:
    """The literal Megatron loop (reference for tests)."""
    num_incr = (global_batch - start) // incr
    per_incr = ramp_samples / num_incr
    consumed = iters = 0
    while consumed <= ramp_samples:
        gbs = min(start + int(consumed / per_incr) * incr, global_batch)
        consumed += gbs
        iters += 1
    return max(0, iters + (train_samples - consumed) // global_batch)


def vocab_from(facts: Facts) -> tuple[Optional[int], str, Optional[str]]:
    """(vocab, origin, warning)."""
    if facts.known("padded_vocab"):
        return facts.val("padded_vocab"), facts.origin("padded_vocab"), None
    if facts.known("vocab"):
        return facts.val("vocab"), facts.origin("vocab"), None
    names = [(facts.val(k) or "", facts.origin(k)) for k in ("tokenizer_model", "vocab_file", "tokenizer")]
    for text, origin in names:
        low = str(text).lower()
        if not low or MARK_OPEN in low:
            continue
        if low in _BY_TYPE:
            continue
        for sub, size in KNOWN_TOKENIZERS:
            if sub in low:
                return size, origin, None
    tok = str(facts.val("tokenizer") or "").lower()
    if tok in _BY_TYPE:
        return _BY_TYPE[tok], facts.origin("tokenizer"), None
    named = facts.val("tokenizer")
    vocab_file = facts.val("vocab_file")
    which = (f"for tokenizer {named}" if named else "(no tokenizer named)") + (f" / {vocab_file}" if vocab_file else "")
    return DEFAULT_VOCAB, "default", f"vocabulary size unknown {which}; assuming GPT-2's {DEFAULT_VOCAB}"


def build(facts: Facts, framework: str, world: World, request: SlurmRequest, req_prov: dict) -> Derived:
    d = Derived()
    f = facts
    w = d.warnings
    for key in _POSITIVE:
        fact = f.d.get(key)
        if fact is not None and fact.unknown is None and fact.value is not None and \
                (not isinstance(fact.value, int) or fact.value < 1):
            d.fail(f"{_FACT_NAMES.get(key, key)} = {fact.value} must be at least 1", fact.origin)
            return d
    if world.gpus is not None and world.gpus < 1:
        d.fail(f"the launch starts {world.gpus} processes", world.origin)
        return d
    # ---------------------------------------------------------------- model
    for key, dotted in _MODEL_REQUIRED:
        _copy(d, f, key, dotted, required=True)
    if f.get("kv_heads") is not None:
        _copy(d, f, "kv_heads", "model.kv_heads")
    _copy(d, f, "ffn_hidden", "model.ffn_hidden")
    vocab, vorigin, vwarn = vocab_from(f)
    d.put("model.vocab", vocab, vorigin)
    if vwarn:
        w.append(vwarn)
    for key, dotted in _MODEL_OPTIONAL:
        _copy(d, f, key, dotted)
    if f.val("attention") == "flash" and f.known("attention_impl"):
        _copy(d, f, "attention_impl", "model.attention_impl")
    # ---------------------------------------------------------------- layout
    pp = _need_int(d, f, "pp", "layout.pp", 1, "pipeline parallel size")
    tp = _need_int(d, f, "tp", "layout.tp", 1, "tensor parallel size")
    cp = f.val("cp", 1) or 1
    if f.get("cp") is not None and not f.known("cp"):
        _unknown(d, f, "cp", "layout.dp")
    if f.known("cp"):
        d.put("layout.cp", cp, f.origin("cp"))
    if cp > 1:
        w.append(f"context/sequence parallel size {cp}: each sequence is split over {cp} GPUs; "
                 f"dp is world / (pp·tp·{cp})")
    dp = None
    if world.unknown:
        d.unresolved.append("layout.dp")
        d.fail(f"number of GPUs unknown: {world.unknown}", world.origin)
    elif world.gpus is not None and pp and tp:
        div = pp * tp * cp
        if world.gpus % div or world.gpus < div:
            # Either side may be the mistake: each is named, the sizes above 1 where they were set,
            # and the line to fix is the first size the GPUs do not divide (else the first above 1).
            set_sizes = [(name, v) for name, v in (("pp", pp), ("tp", tp), ("cp", cp)) if v > 1 and f.origin(name)]
            culprit = next(((name, v) for name, v in set_sizes if world.gpus % v), set_sizes[0] if set_sizes else None)
            others = [f"{name} {f.origin(name)}" for name, v in set_sizes if (name, v) != culprit]
            verb = "are not divisible by" if world.gpus % div else "cannot hold"
            text = f"{world.gpus} GPUs ({world.origin}) {verb} pp×tp×cp = {pp}×{tp}×{cp}"
            text += f" ({', '.join(others)})" if others else ""
            if culprit is None:
                d.fail(text, world.origin)
            else:
                d.fail(f"{text} — {culprit[0]} = {culprit[1]}", f.origin(culprit[0]))
        else:
            dp = world.gpus // div
            d.put("layout.dp", dp, world.origin)
    micro, mbs = _batch(d, f, framework, dp)
    if micro is not None:
        d.put("layout.micro_batch", micro, f.origin("micro_batch") or f.origin("ds_micro"))
    if mbs is not None:
        d.put("layout.micro_batches", mbs[0], mbs[1])
    _zero(d, f, framework)
    for key, dotted in _LAYOUT_OPTIONAL:
        _copy(d, f, key, dotted)
    _copy(d, f, "hsdp_shard", "layout.dp_shard")      # hybrid sharding's group (llmfoundry.py)
    # ---------------------------------------------------------------- run
    if framework in _FRAMEWORKS:
        d.put("run.framework", framework, f.origin("framework", "the launch command"))
    _precision(d, f, framework)
    _iterations(d, f, micro, mbs[0] if mbs else None, dp)
    ei = f.val("eval_iters")
    for key, dotted in _RUN_OPTIONAL:
        _copy(d, f, key, dotted)
    if ei == 0 or d.job_dict["run"].get("eval_iters") == 0:
        d.put("run.eval_interval", 0, f.origin("eval_iters"))
    if f.known("exit_duration"):
        d.exit_duration = f.val("exit_duration")
    # ---------------------------------------------------------------- cluster
    gpn = world.per_node or request.gpus_per_node
    if gpn:
        d.put("cluster.gpus_per_node", gpn, world.origin if world.per_node else
              req_prov.get("request.gpus_per_node", "request"))
    # ---------------------------------------------------------------- defaults that may be wrong
    if f.hidden_args:
        for dotted, origin in list(d.provenance.items()):
            if "default" in origin and dotted not in d.unresolved:
                d.unresolved.append(dotted)
        w.append(f"the launch command contains arguments that are unknown ({f.hidden_args}); "
                 f"keys left at their defaults may be set there")
    for dotted in list(d.unresolved):
        if dotted in CRITICAL and d.error is None:
            fact = _fact_for(f, dotted)
            d.fail(f"{dotted} unknown: {fact.unknown if fact and fact.unknown else 'not found'}",
                   fact.origin if fact else "")
    return d


def _fact_for(f: Facts, dotted: str):
    key = dotted.split(".")[1]
    return f.get({"micro_batches": "global_batch"}.get(key, key))


def _copy(d: Derived, f: Facts, key: str, dotted: str, required: bool = False) -> None:
    fact = f.d.get(key)
    if fact is None:
        if required:
            d.unresolved.append(dotted)
            d.fail(f"{dotted} not found in the launch command or its configs", "")
        return
    if fact.unknown is not None:
        _unknown(d, f, key, dotted)
        return
    sec, _, name = dotted.partition(".")     # d.put, inline: the common path of every copied key
    d.job_dict[sec][name] = fact.value
    if fact.origin:
        d.provenance[dotted] = fact.origin


def _unknown(d: Derived, f: Facts, key: str, dotted: str) -> None:
    fact = f.get(key)
    if dotted not in d.unresolved:
        d.unresolved.append(dotted)
    reason = fact.unknown if fact else "unknown"
    where = fact.origin if fact else ""
    if dotted in CRITICAL:
        d.fail(f"{dotted} unknown: {reason}", where)
    else:
        d.warnings.append(f"{dotted} unknown ({reason}; {where}); using the default")


def _need_int(d: Derived, f: Facts, key: str, dotted: str, default: int, what: str) -> Optional[int]:
    fact = f.get(key)
    if fact is None:
        d.put(dotted, default, "default")
        return default
    if fact.unknown is not None:
        _unknown(d, f, key, dotted)
        return None
    d.put(dotted, fact.value, fact.origin)
    return fact.value


def _batch(d: Derived, f: Facts, framework: str, dp: Optional[int]):
    """(micro, (micro_batches, origin)) per framework rules."""
    w = d.warnings
    if framework == "neox":
        micro, gas, tb = f.val("micro_batch"), f.val("grad_accum"), f.val("global_batch")
        for k in ("micro_batch", "grad_accum", "global_batch"):
            if f.get(k) is not None and not f.known(k):
                _unknown(d, f, k, "layout.micro_batches" if k != "micro_batch" else "layout.micro_batch")
                return None, None
        if dp is None:
            return micro, None
        defaulted = bool(f.val("grad_accum_defaulted"))
        if micro is None and tb is not None:
            micro = max(1, tb // max(gas or 1, 1) // dp)
            f.set("micro_batch", micro, f.origin("global_batch"))
        if micro is None:
            d.unresolved.append("layout.micro_batch")
            d.fail("train_micro_batch_size_per_gpu not found in the NeoX configs", "")
            return None, None
        if tb is not None:
            want = micro * gas * dp
            if tb != want:
                if defaulted and tb % (micro * dp) == 0:
                    w.append(f"train_batch_size {tb} with micro {micro} and no gradient_accumulation_steps: "
                             f"NeoX's consistency check (GAS defaults to 1) would fail; using GAS = "
                             f"{tb // (micro * dp)}")
                    return micro, (tb // (micro * dp), f.origin("global_batch"))
                d.fail(f"train_batch_size {tb} ≠ micro {micro} × GAS {gas} × dp {dp}", f.origin("global_batch"))
                return micro, None
        return micro, (gas, f.origin("grad_accum"))
    # Megatron (incl. Megatron-DeepSpeed) and plain DeepSpeed
    if framework in ("megatron", "megatron-deepspeed", "nemo", "torchtitan", "llm-foundry"):
        # NeMo (Megatron-core), TorchTitan and llm-foundry also take a micro and a global batch
        if f.get("micro_batch") is not None and not f.known("micro_batch"):
            _unknown(d, f, "micro_batch", "layout.micro_batch")
            return None, None
        micro = f.val("micro_batch")
        if micro is None and f.known("ds_micro"):
            micro = f.val("ds_micro")
            w.append("--micro-batch-size missing: using the DeepSpeed config's train_micro_batch_size_per_gpu")
        if micro is None:
            d.unresolved.append("layout.micro_batch")
            d.fail({"nemo": "model.micro_batch_size not found in the NeMo config",
                    "torchtitan": "[training] local_batch_size not found in the TorchTitan config",
                    "llm-foundry": "device_train_microbatch_size not found in the llm-foundry config"}.get(
                framework, "--micro-batch-size not found (Megatron requires it)"), "")
            return None, None
        if dp is None:
            return micro, None
        if f.get("global_batch") is not None and not f.known("global_batch"):
            _unknown(d, f, "global_batch", "layout.micro_batches")
            return micro, None
        gbs = f.val("global_batch")
        origin = f.origin("global_batch")
        if gbs is None:
            gbs, origin = micro * dp, f.origin("micro_batch")
        if gbs % (micro * dp):
            d.fail(f"global batch {gbs} is not divisible by micro batch {micro} × dp {dp} "
                   f"(Megatron stops at start-up)", origin)
            return micro, None
        if framework == "megatron-deepspeed":
            for k, mine in (("ds_train_batch", gbs), ("ds_micro", micro)):
                if f.known(k) and f.val(k) != mine:
                    w.append(f"DeepSpeed config {k[3:]} = {f.val(k)} differs from the Megatron arguments "
                             f"({mine}); Megatron-DeepSpeed uses the Megatron values")
        f.set("global_batch_final", gbs, origin)
        return micro, (gbs // (micro * dp), origin)
    # generic DeepSpeed script
    if dp is None:
        return f.val("ds_micro"), None
    for k in ("ds_train_batch", "ds_micro", "ds_gas"):
        if f.get(k) is not None and not f.known(k):
            _unknown(d, f, k, "layout.micro_batches")
            return None, None
    from .deepspeed import resolve_batch
    res = resolve_batch(f, dp)
    if res is None:
        d.unresolved.append("layout.micro_batch")
        d.fail("no batch size in the DeepSpeed config", f.origin("ds_config_loaded"))
        return None, None
    tb, mb, gas = res
    f.set("micro_batch", mb, f.origin("ds_micro") or f.origin("ds_train_batch"))
    return mb, (gas, f.origin("ds_gas") or f.origin("ds_train_batch") or f.origin("ds_micro"))


def _zero(d: Derived, f: Facts, framework: str) -> None:
    if framework == "megatron-deepspeed" or framework == "deepspeed":
        if f.get("ds_zero_stage") is not None:
            if f.known("cli_zero_stage") and f.known("ds_zero_stage") and f.val("cli_zero_stage") != f.val("ds_zero_stage"):
                d.warnings.append(f"--zero-stage {f.val('cli_zero_stage')} ({f.origin('cli_zero_stage')}) differs from "
                                  f"the DeepSpeed config's zero_optimization.stage {f.val('ds_zero_stage')} "
                                  f"({f.origin('ds_zero_stage')}); the engine uses the config")
            _copy(d, f, "ds_zero_stage", "layout.zero_stage")
            if not f.known("ds_zero_stage"):
                d.job_dict["layout"]["zero_stage"] = 0   # DeepSpeed's default, not the predictor's
        elif f.get("cli_zero_stage") is not None and not f.val("ds_config_loaded"):
            _copy(d, f, "cli_zero_stage", "layout.zero_stage")
            d.warnings.append("ZeRO stage taken from --zero-stage: the DeepSpeed config could not be read")
        elif f.get("dist_opt_stage") is not None:
            _copy(d, f, "dist_opt_stage", "layout.zero_stage")
        else:
            d.put("layout.zero_stage", 0, "DeepSpeed default")
        return
    if f.get("zero_stage") is not None:
        _copy(d, f, "zero_stage", "layout.zero_stage")


def _precision(d: Derived, f: Facts, framework: str) -> None:
    if framework == "deepspeed":
        _copy(d, f, "ds_precision", "run.precision")
        return
    if framework == "megatron-deepspeed" and f.known("ds_precision") and f.known("precision") \
            and f.val("ds_precision") != f.val("precision"):
        d.warnings.append(f"precision: Megatron arguments say {f.val('precision')}, the DeepSpeed config says "
                          f"{f.val('ds_precision')}; using the Megatron arguments")
    _copy(d, f, "precision", "run.precision")
    _copy(d, f, "fp8_recipe", "run.fp8")
    _copy(d, f, "grad_reduce_precision", "run.grad_reduce_precision")
    _copy(d, f, "compile", "run.compile")


def _iterations(d: Derived, f: Facts, micro: Optional[int], mbs: Optional[int], dp: Optional[int]) -> None:
    w = d.warnings
    gbs = f.val("global_batch_final")
    if gbs is None and micro and mbs and dp:
        gbs = micro * mbs * dp
    seq = f.val("seq_len")
    candidates = []   # (iters, origin)
    for key in ("train_iters", "train_samples", "train_tokens"):
        fact = f.get(key)
        if fact is not None and fact.unknown is not None:
            d.unresolved.append("run.train_iters")
            w.append(f"run.train_iters unknown: {key} is {fact.unknown} ({fact.origin})")
            return
    if f.known("train_iters"):
        candidates.append((f.val("train_iters"), f.origin("train_iters")))
    elif f.known("train_samples") and gbs:
        ts = f.val("train_samples")
        d.put("run.train_samples", ts, f.origin("train_samples"))
        ramp = f.val("rampup")
        if ramp:
            try:
                it = rampup_iterations(ts, gbs, *ramp)
            except ValueError as exc:
                w.append(f"--rampup-batch-size ignored: {exc}")
                it = ts // gbs
        else:
            it = ts // gbs
        candidates.append((it, f.origin("train_samples")))
    if f.known("train_tokens") and gbs and seq:
        tt = f.val("train_tokens")
        d.put("run.train_tokens", tt, f.origin("train_tokens"))
        candidates.append((-(-tt // (gbs * seq)), f.origin("train_tokens")))
    if not candidates:
        d.unresolved.append("run.train_iters")
        w.append("no --train-iters / --train-samples / --train-tokens (or train_iters) found: "
                 "the job's length is unknown")
        return
    it, origin = min(candidates)
    if f.known("exit_interval") and 0 < f.val("exit_interval") < it:
        w.append(f"--exit-interval {f.val('exit_interval')} stops the run before {it} iterations")
        it, origin = f.val("exit_interval"), f.origin("exit_interval")
    d.put("run.train_iters", it, origin)
