#!/usr/bin/env python3
"""Every number the predictor gives on a fixed set of jobs, to check that a refactor changed none.

    python scripts/prediction_fingerprint.py --out after.jsonl
    python scripts/prediction_fingerprint.py --compare before.jsonl after.jsonl

The set: every example under examples/ on every shipped platform, every recorded run of every
shipped platform (``[[validation]]`` in its platform.toml) on that platform, and a grid of layouts
as perf-advise would try them (PP × TP × DP × micro-batch × recompute × ZeRO) for three models on
each platform, predicted in one batch.  Each line of the output is one prediction's ``to_dict()``
(floats written with ``repr``, so exact), or the error it raised.

Each job is predicted twice: ``fresh`` (nothing remembered from earlier jobs: a new
:class:`predictor.Predictor` per call) and ``reused`` (one predictor per platform for the whole run,
so later jobs take memoised answers), because the two paths cost a shape differently.

To compare with an older commit, run the script of this tree against a worktree of that commit::

    git worktree add /tmp/base <commit>
    (cd /tmp/base && PYTHONPATH=/tmp/base python /work/main/scripts/prediction_fingerprint.py --out /tmp/before.jsonl)
    python scripts/prediction_fingerprint.py --out /tmp/after.jsonl
    python scripts/prediction_fingerprint.py --compare /tmp/before.jsonl /tmp/after.jsonl
    # across a change that only added output keys (the breakdown's unit-named keys, 3051018):
    python scripts/prediction_fingerprint.py --compare /tmp/before.jsonl /tmp/after.jsonl --common-keys

The predictor is imported from ``PYTHONPATH`` (else this tree); before ``Predictor`` existed the
fresh path forgets the module's memos before each call instead.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import predictor
from predictor import TrainingJob, estimate, list_platforms, load_platform

ROOT = Path(__file__).resolve().parents[1]

# The grid's models: a dense GPT, a parallel-residual NeoX and a GQA/SwiGLU/flash Llama.
GRID_MODELS = {
    "gpt-2.7b": {"layers": 32, "hidden": 2560, "heads": 32, "seq_len": 2048},
    "neox-20b": {"layers": 44, "hidden": 6144, "heads": 64, "seq_len": 2048, "parallel_residual": True},
    "llama-8b": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336,
                 "activation": "swiglu", "norm": "rmsnorm", "attention": "flash", "vocab": 128256,
                 "seq_len": 4096},
}
GRID_GPUS = 64
GRID_GLOBAL_BATCH = 512
# Each a change to the llama-8b job at 64 GPUs, for the paths the grid does not take (an error,
# e.g. FP8 on a GPU without it, is recorded as the answer).
_BASE_LAYOUT = {"pp": 2, "tp": 4, "dp": 8, "micro_batch": 1, "micro_batches": 64, "zero_stage": 1,
                "recompute": "selective"}
FEATURES = {
    "cp2": ({"cp": 2, "dp": 4, "micro_batches": 128}, {}),
    "fp8-delayed": ({}, {"fp8": "delayed"}),
    "fp8-current-full": ({"recompute": "full"}, {"fp8": "current", "framework": "megatron"}),
    "tp-comm-overlap": ({"tp_comm_overlap": True, "sequence_parallel": True}, {"framework": "megatron"}),
    "overlap-dp": ({"overlap_grad_reduce": True, "overlap_param_gather": True}, {"framework": "megatron"}),
    "virtual-stages": ({"pp": 4, "dp": 4, "virtual_stages": 2, "micro_batches": 128}, {"framework": "megatron"}),
    "deepspeed-pp": ({"pp": 4, "dp": 4, "micro_batches": 128}, {"framework": "deepspeed"}),
    "neox-tied": ({}, {"framework": "neox"}),
    "fsdp-hybrid": ({"pp": 1, "tp": 1, "dp": 64, "micro_batches": 8, "zero_stage": 3, "dp_shard": 8},
                    {"framework": "torchtitan"}),
    "fsdp-keep": ({"pp": 1, "tp": 2, "dp": 32, "micro_batches": 16, "zero_stage": 3,
                   "reshard_after_forward": "never"}, {"framework": "torchtitan"}),
    "zero2-nemo": ({"pp": 1, "tp": 2, "dp": 32, "micro_batches": 16, "zero_stage": 2}, {"framework": "nemo"}),
    "fp32-grads": ({}, {"framework": "megatron", "grad_reduce_precision": "fp32"}),
    "eval-save": ({}, {"eval_interval": 100, "eval_iters": 10, "save_interval": 250}),
}


def grid_layouts(gpus: int, global_batch: int) -> Iterator[dict[str, Any]]:
    for pp, tp, mb, recompute, zero in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4),
                                                         ("none", "selective", "full"), (0, 1, 3)):
        dp = gpus // (pp * tp)
        if dp < 1 or pp * tp * dp != gpus or global_batch % (dp * mb):
            continue
        if zero == 3 and pp > 1:
            continue
        yield {"pp": pp, "tp": tp, "dp": dp, "micro_batch": mb,
               "micro_batches": global_batch // (dp * mb), "recompute": recompute, "zero_stage": zero}


class Backend:
    """predict / predict_many, fresh or reused, over whichever predictor PYTHONPATH gives."""

    def __init__(self) -> None:
        self.predictor_cls = getattr(predictor, "Predictor", None)
        self.estimate = estimate
        self.kept: dict[int, Any] = {}

    def batch(self, jobs: Sequence[Any], platform: Any, mode: str) -> list[Any]:
        if self.predictor_cls is not None:
            if mode == "fresh":
                return self.predictor_cls(platform).predict_many(jobs)
            p = self.kept.get(id(platform))
            if p is None:
                p = self.kept[id(platform)] = self.predictor_cls(platform)
            return p.predict_many(jobs)
        if mode == "fresh":
            self.estimate.clear_memos()
        return self.estimate.predict_many(jobs, platform)


def _one(fn: Callable[[], list[Any]], ids: Sequence[str], gpu_memory_gib: float) -> list[dict[str, Any]]:
    try:
        preds = fn()
    except Exception as exc:   # an error is part of the answer
        return [{"id": i, "error": f"{type(exc).__name__}: {exc}"} for i in ids]
    return [{"id": i, "prediction": p.to_dict(gpu_memory_gib)} for i, p in zip(ids, preds)]


def fingerprint() -> list[dict[str, Any]]:
    backend = Backend()
    names = sorted(p["name"] for p in list_platforms())
    platforms = {n: load_platform(n) for n in names}
    examples = sorted((ROOT / "examples").glob("*.toml"))
    out: list[dict[str, Any]] = []
    for mode in ("fresh", "reused"):
        for name, plat in platforms.items():
            gib = float(plat.gpu.memory_gib)
            for path in examples:
                job = TrainingJob.from_toml(path)
                out += _one(lambda: backend.batch([job], plat, mode), [f"{mode}/{name}/example/{path.name}"], gib)
            for i, run in enumerate(plat.validation):
                out += _one(lambda: backend.batch([run.job], plat, mode),
                            [f"{mode}/{name}/run/{i}/{run.name}"], gib)
            for model_name, model in GRID_MODELS.items():
                jobs, ids = [], []
                for lay in grid_layouts(GRID_GPUS, GRID_GLOBAL_BATCH):
                    try:
                        jobs.append(TrainingJob.from_dict({
                            "model": model, "layout": lay, "run": {"precision": "bf16", "train_iters": 1000},
                            "cluster": {"gpus_per_node": plat.gpus_per_node}}))
                    except Exception:      # a layout the job rules reject: not a prediction
                        continue
                    ids.append(f"{mode}/{name}/grid/{model_name}/" + "-".join(f"{k}{v}" for k, v in lay.items()))
                out += _one(lambda: backend.batch(jobs, plat, mode), ids, gib)
            for feature, (layout, run) in FEATURES.items():
                model = GRID_MODELS["llama-8b"]
                if feature == "neox-tied":
                    model = dict(model, tied_embeddings=True)
                try:
                    job = TrainingJob.from_dict({
                        "model": model, "layout": dict(_BASE_LAYOUT, **layout),
                        "run": dict({"precision": "bf16", "train_iters": 1000}, **run),
                        "cluster": {"gpus_per_node": plat.gpus_per_node}})
                except Exception as exc:
                    out.append({"id": f"{mode}/{name}/feature/{feature}", "error": f"job: {exc}"})
                    continue
                out += _one(lambda: backend.batch([job], plat, mode), [f"{mode}/{name}/feature/{feature}"], gib)
    return out


def compare(before: Path, after: Path, limit: int = 20, common_keys: bool = False) -> int:
    """Print what differs; ``common_keys``: a key only one side has (an output that gained a key)
    is counted apart instead of as a difference."""
    a = {r["id"]: r for r in map(json.loads, before.read_text().splitlines())}
    b = {r["id"]: r for r in map(json.loads, after.read_text().splitlines())}
    diffs: list[str] = [f"only in {before.name}: {k}" for k in a if k not in b]
    diffs += [f"only in {after.name}: {k}" for k in b if k not in a]
    extra: set[str] = set()
    for k in a:
        if k in b and a[k] != b[k]:
            found = list(_differences(a[k], b[k], "", extra if common_keys else None))
            if found:
                diffs.append(f"differs: {k}: " + "; ".join(found)[:400])
    if extra:
        print(f"keys on one side only (not compared): {', '.join(sorted(extra))}")
    for line in diffs[:limit]:
        print(line)
    print(f"{len(a)} vs {len(b)} predictions; {len(diffs)} differ" + (" (first shown)" if len(diffs) > limit else ""))
    return 1 if diffs else 0


def _differences(x: Any, y: Any, at: str = "", one_sided: Optional[set[str]] = None) -> Iterator[str]:
    if isinstance(x, dict) and isinstance(y, dict):
        keys = set(x) | set(y)
        if one_sided is not None:
            one_sided.update(f"{at}.{k}".lstrip(".") for k in keys ^ (set(x) & set(y)))
            keys = set(x) & set(y)
        for k in sorted(keys):
            yield from _differences(x.get(k), y.get(k), f"{at}.{k}", one_sided)
    elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        for i, (u, v) in enumerate(zip(x, y)):
            yield from _differences(u, v, f"{at}[{i}]", one_sided)
    elif x != y:
        yield f"{at}: {x!r} -> {y!r}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write one JSON line per prediction here")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--common-keys", action="store_true",
                    help="with --compare: compare only the keys both sides have (an output that gained keys)")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*args.compare, common_keys=args.common_keys)
    rows = fingerprint()
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    if args.out:
        args.out.write_text(text)
    errors = sum(1 for r in rows if "error" in r)
    print(f"{len(rows)} predictions ({errors} errors), sha256 {hashlib.sha256(text.encode()).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
