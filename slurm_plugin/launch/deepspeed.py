"""DeepSpeed JSON config -> facts (``ds_*`` keys), and the deepspeed launcher's world size.

The engine reads batch sizes, precision and ZeRO from the JSON (runtime/config.py); HF-style
``"auto"`` values and sed placeholders (``GBSIZE``) are unknown until something fills them.
"""
from __future__ import annotations

from typing import Any, Optional

from .configs import MAX_INT_SETTING, Config, to_bool, to_int, to_number
from .facts import Facts
from .limits import CannotPredict
from .neox_keys import (DEEPSPEED_KEYS, DEEPSPEED_SHAPE_KEYS, PRECISION_KEYS, check_activation_checkpointing_keys,
                        check_keys, check_precision_keys, check_zero_keys, check_zero_stage)
from .values import MARK_OPEN


# The activation_checkpointing options the predictor costs -> their facts.  The section applies
# where the training script passes the JSON to deepspeed.checkpointing.configure; Megatron-DeepSpeed
# passes its own flags after it, which win (megatron.py).
ACTIVATION_CHECKPOINTING_FACTS = (("partition_activations", "ds_partition_activations"),
                                  ("cpu_checkpointing", "ds_cpu_checkpointing"),
                                  ("synchronize_checkpoint_boundary", "ds_synchronize_checkpoint_boundary"),
                                  ("contiguous_memory_optimization", "ds_contiguous_checkpointing"))


#: the batch sizes of a DeepSpeed config (the facts they set)
_BATCH_FACTS = frozenset({"ds_train_batch", "ds_micro", "ds_gas"})


def _num(facts: Facts, key: str, cfg: Config, path: tuple, value: Any) -> None:
    origin = cfg.origin(path)
    if isinstance(value, str) and MARK_OPEN in value:
        facts.set_unknown(key, facts.u.reason(value) or "unknown", origin)
        return
    n = to_int(value)
    if n is None:
        reason = f"{'.'.join(map(str, path))} is {str(value)[:30]!r} in {cfg.label}"
        number = to_number(value)
        if (isinstance(value, str) and number is None and value != "auto" and key in _BATCH_FACTS
                and path not in cfg.bare):          # (bare: a template's word, filled in before the run)
            # DeepSpeedConfig's batch check compares the three sizes with 0 and multiplies them:
            # a word there raises TypeError before the first step ("auto" is filled in by HF's
            # integration, which perfcast does not follow: unknown, not refused).
            raise CannotPredict(f"{reason}, not a number: DeepSpeed stops at start (its batch size "
                                f"check cannot compare it)", origin)
        if value != "auto":
            what = ("not a number" if number is None else
                    "too large for any job" if abs(number) > MAX_INT_SETTING else "not a whole number")
            facts.warnings.append(f"{reason}, {what} ({origin})")
        facts.set_unknown(key, reason, origin)
        return
    facts.set(key, n, origin)


def read_config(cfg: Config, facts: Facts) -> None:
    d = cfg.data
    if isinstance(d, str) and MARK_OPEN in d:
        facts.warnings.append(f"DeepSpeed config {cfg.label} is unknown ({facts.u.reason(d) or '?'}): its keys are not "
                              f"read ({cfg.line_origin(1)})")
        return
    if not isinstance(d, dict):
        # DeepSpeedConfig reads its keys with dict.get (Megatron-DeepSpeed first tests keys with `in`):
        # a list, a number or null there stops the job at start.
        what = "null" if d is None else f"a JSON {'list' if isinstance(d, list) else type(d).__name__}"
        raise CannotPredict(f"DeepSpeed config {cfg.label} is {what}, not a JSON object of config keys: DeepSpeed "
                            f"stops at start", cfg.line_origin(1))
    facts.set("ds_config_loaded", True, cfg.label)
    zero = d.get("zero_optimization")
    if isinstance(zero, dict):          # a misspelt ``stage`` stops the parse
        check_zero_keys(zero, lambda k: cfg.origin(("zero_optimization", k)), f"{cfg.label} zero_optimization",
                        facts.warnings)
    check_keys(((k, cfg.origin((k,))) for k in d if isinstance(k, str)), DEEPSPEED_KEYS, DEEPSPEED_SHAPE_KEYS,
               "DeepSpeed config", cfg.label, facts.warnings)
    for key, fact in (("train_batch_size", "ds_train_batch"), ("train_micro_batch_size_per_gpu", "ds_micro"),
                      ("gradient_accumulation_steps", "ds_gas")):
        if d.get(key) is not None:          # null: not given (DeepSpeed reads them with get)
            _num(facts, fact, cfg, (key,), d[key])
    for sect in PRECISION_KEYS:
        block = d.get(sect)
        if isinstance(block, dict):
            check_precision_keys(sect, block, lambda k, s=sect: cfg.origin((s, k)), f"{cfg.label} {sect}",
                                 facts.warnings)
    prec = None
    for sect, name in (("bf16", "bf16"), ("bfloat16", "bf16"), ("fp16", "fp16"), ("amp", "fp16")):
        block = d.get(sect)
        if isinstance(block, dict):
            en = block.get("enabled", False if sect != "fp16" else False)
            if isinstance(en, str) and MARK_OPEN in en:
                facts.set_unknown("ds_precision", facts.u.reason(en) or "unknown", cfg.origin((sect, "enabled")))
                prec = "?"
                break
            if to_bool(en):
                if sect == "fp16" and str(block.get("type", "")).lower() in ("bfloat16", "bf16"):
                    name = "bf16"
                facts.set("ds_precision", name, cfg.origin((sect, "enabled")))
                prec = name
                break
    if prec is None:
        facts.set("ds_precision", "fp32", f"{cfg.label} (no fp16/bf16 section enabled)")
    z = d.get("zero_optimization")
    if isinstance(z, bool):
        facts.set("ds_zero_stage", 1 if z else 0, cfg.origin(("zero_optimization",)))
    elif isinstance(z, dict):
        if "stage" in z:
            if ("zero_optimization", "stage") not in cfg.bare:     # a bare word is a template's placeholder
                check_zero_stage(z["stage"], cfg.label, cfg.origin(("zero_optimization", "stage")))
            _num(facts, "ds_zero_stage", cfg, ("zero_optimization", "stage"), z["stage"])
        else:
            facts.set("ds_zero_stage", 0, cfg.origin(("zero_optimization",)))
    else:
        facts.set("ds_zero_stage", 0, f"{cfg.label} (no zero_optimization)")
    ac = d.get("activation_checkpointing")
    if isinstance(ac, dict):
        check_activation_checkpointing_keys(ac, lambda k: cfg.origin(("activation_checkpointing", k)),
                                            f"{cfg.label} activation_checkpointing", facts.warnings)
        for key, fact in ACTIVATION_CHECKPOINTING_FACTS:
            if to_bool(ac.get(key)):
                facts.set(fact, True, cfg.origin(("activation_checkpointing", key)))


def resolve_batch(facts: Facts, dp: int) -> Optional[tuple[int, int, int]]:
    """DeepSpeed's _set_batch_related_parameters: (train_batch, micro, gas) or None."""
    tb, mb, gas = facts.val("ds_train_batch"), facts.val("ds_micro"), facts.val("ds_gas")
    if tb is not None and mb is not None and gas is not None:
        return tb, mb, gas
    if tb is not None and mb is not None:
        return tb, mb, max(1, tb // mb // max(dp, 1))
    if tb is not None and gas is not None:
        return tb, max(1, tb // max(dp, 1) // max(gas, 1)), gas
    if mb is not None and gas is not None:
        return mb * gas * dp, mb, gas
    if tb is not None:
        return tb, max(1, tb // max(dp, 1)), 1
    if mb is not None:
        return mb * dp, mb, 1
    return None
