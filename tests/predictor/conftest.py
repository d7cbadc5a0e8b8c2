import sys
from pathlib import Path

import pytest

from predictor import TrainingJob, load_platform
from predictor.platform import resolve_platform, write_platform

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

GPT20B = {"layers": 44, "hidden": 6144, "heads": 64, "seq_len": 2048, "parallel_residual": True,
          "attention": "fused_softmax", "norm": "layernorm", "activation": "gelu"}


def make_job(model=None, **layout):
    lay = {"pp": 4, "tp": 4, "dp": 8, "micro_batch": 4, "micro_batches": 16, "zero_stage": 1,
           "recompute": "full"}
    lay.update(layout)
    return TrainingJob.from_dict({"model": dict(model or GPT20B), "layout": lay,
                                  "run": {"train_iters": 100}})


def small_job(layers=8, hidden=4096, heads=32, seq=2048, pp=1, tp=1, dp=1, mb=2, mbs=8, recompute="full",
              **model) -> TrainingJob:
    """A one-node fp16 job of the given shape (the fit tests' jobs); ``model`` adds model keys."""
    return TrainingJob.from_dict({"model": {"layers": layers, "hidden": hidden, "heads": heads, "seq_len": seq,
                                            **model},
                                  "layout": {"pp": pp, "tp": tp, "dp": dp, "micro_batch": mb,
                                             "micro_batches": mbs, "recompute": recompute},
                                  "run": {"precision": "fp16"}})


def with_run(job: TrainingJob, **run) -> TrainingJob:
    """``job`` with ``run`` keys set (its framework, say)."""
    d = job.to_dict()
    d["run"].update(run)
    return type(job).from_dict(d)


def copy_shipped_platform(dest: Path, name: str, **changes) -> Path:
    """A shipped platform's platform.toml written into ``dest``/``name`` with its bundle paths made
    absolute, each of ``changes`` set as a top-level key (None removes it); returns the directory."""
    src = resolve_platform(name)
    raw = tomllib.loads((src / "platform.toml").read_text(encoding="utf-8"))
    raw["compute_bundle"] = str((src / raw["compute_bundle"]).resolve())
    if raw.get("collective_bundle"):
        raw["collective_bundle"] = str((src / raw["collective_bundle"]).resolve())
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    write_platform(dest / name, raw)
    return dest / name


@pytest.fixture(scope="session")
def perlmutter():
    return load_platform("perlmutter-a100")


@pytest.fixture(scope="session")
def vista():
    return load_platform("vista-gh200")
