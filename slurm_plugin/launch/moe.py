"""Mixture-of-experts detection: such jobs are refused, never predicted as the dense model.

The predictor costs every FFN as one dense matrix per layer; an MoE layer runs top-k of N experts
with an all-to-all between them, so a dense prediction would be wrong by a large, unknown factor.
Every reader calls :func:`refuse` with the key and its ``file:line`` as soon as it sees one.
"""
from __future__ import annotations

from typing import Any

from .configs import Config, to_int
from .limits import CannotPredict
from .values import MARK_OPEN

MOE_REASON = "mixture-of-experts models are not modelled yet"

# Config keys that count experts, across the frameworks' config files: NeoX (moe_num_experts),
# NeMo (num_moe_experts), Hugging Face Mixtral / Qwen-MoE (num_local_experts, num_experts) and
# DeepSeek (n_routed_experts).
EXPERT_COUNT_KEYS = ("moe_num_experts", "num_moe_experts", "num_local_experts", "num_experts",
                     "n_routed_experts")


def refuse(what: str, where: str) -> None:
    """Stop the parse: ``what`` names the key that says MoE (``--num-experts 8``)."""
    raise CannotPredict(f"{MOE_REASON} ({what})", where)


def experts(value: Any) -> int:
    """The expert count a config value asks for (0 when it is not a number)."""
    n = to_int(value)
    return n if n is not None else 0


def check_count(value: Any, what: str, where: str) -> None:
    """Refuse an expert count above 1, and one that is unknown (it may be above 1)."""
    if isinstance(value, str) and MARK_OPEN in value:
        raise CannotPredict(f"{what} is unknown: a mixture-of-experts model cannot be ruled out", where)
    n = experts(value)
    if n > 1:
        refuse(f"{what} = {n}", where)


def check_config(cfg: Config) -> None:
    """Refuse a config whose top level, or a section one level down (NeMo ``model:``), counts experts.

    Only two levels are looked at, so the cost is linear in the config's size.
    """
    data = cfg.data
    if not isinstance(data, dict):
        return
    scopes: list = [((), data)]
    for k, v in data.items():
        if isinstance(v, dict):
            scopes.append(((k,), v))
    for prefix, d in scopes:
        for key in EXPERT_COUNT_KEYS:
            if key in d and experts(d[key]) > 1:
                path = prefix + (key,)
                refuse(f"{'.'.join(map(str, path))} = {experts(d[key])} in {cfg.label}", cfg.origin(path))
