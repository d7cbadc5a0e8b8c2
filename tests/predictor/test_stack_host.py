"""Host costs that grow with a layer's collectives and with FSDP's per-layer hooks."""
from __future__ import annotations

import dataclasses

import pytest

from predictor import TrainingJob, load_platform
from predictor.errors import BundleError
from predictor.estimate import QuerySet, _plan
from predictor.host import HostCosts


def _host_per_micro_batch(job: TrainingJob, plat) -> list[float]:
    return _plan(job, plat, QuerySet(plat)).stage_host


def _job(**layout) -> TrainingJob:
    return TrainingJob.from_dict({"model": {"layers": 4, "hidden": 512, "heads": 8, "seq_len": 1024},
                                  "layout": {"micro_batch": 1, "micro_batches": 2, "recompute": "none",
                                             "zero_stage": 0, **layout},
                                  "run": {"precision": "bf16"}})


def test_each_tp_collective_costs_the_measured_call_not_a_launch():
    plat = load_platform("dgx-h100")
    h = plat.host
    assert h.collective_seconds > h.launch_seconds > 0
    solo = _host_per_micro_batch(_job(tp=1), plat)[0]
    tp2 = _host_per_micro_batch(_job(tp=2), plat)[0]
    # 4 layers × 4 all-reduces (2 forward, 2 backward, no recompute), each one c10d call.
    assert tp2 - solo == pytest.approx(16 * h.collective_seconds)
    # Without a measured figure a collective costs one launch, as before.
    old = dataclasses.replace(plat, host=dataclasses.replace(h, collective_seconds=-1.0))
    assert _host_per_micro_batch(_job(tp=2), old)[0] - solo == pytest.approx(16 * h.launch_seconds)


def test_fsdp_hooks_paid_per_layer_under_fsdp_frameworks_only():
    plat = load_platform("dgx-h100")
    base = {"model": {"layers": 4, "hidden": 512, "heads": 8, "seq_len": 1024},
            "layout": {"dp": 8, "micro_batch": 1, "micro_batches": 1, "recompute": "none"},
            "run": {"precision": "bf16", "framework": "torchtitan"}}
    ddp = TrainingJob.from_dict({**base, "layout": {**base["layout"], "zero_stage": 1}})
    fsdp = TrainingJob.from_dict({**base, "layout": {**base["layout"], "zero_stage": 3}})
    extra = _host_per_micro_batch(fsdp, plat)[0] - _host_per_micro_batch(ddp, plat)[0]
    assert extra == pytest.approx(4 * plat.host.fsdp_layer_seconds)
    # DeepSpeed's ZeRO-3 runs hooks of its own, measured apart: its figure, not FSDP's.
    assert plat.host.zero3_layer_seconds > 0 and plat.host.zero3_layer_seconds != plat.host.fsdp_layer_seconds
    ds = TrainingJob.from_dict({**base, "layout": {**base["layout"], "zero_stage": 3},
                                "run": {"precision": "bf16", "framework": "deepspeed"}})
    ds1 = TrainingJob.from_dict({**base, "layout": {**base["layout"], "zero_stage": 1},
                                 "run": {"precision": "bf16", "framework": "deepspeed"}})
    extra = _host_per_micro_batch(ds, plat)[0] - _host_per_micro_batch(ds1, plat)[0]
    assert extra == pytest.approx(4 * plat.host.zero3_layer_seconds)
    # A job that names no framework is charged neither.
    plain = {**base, "run": {"precision": "bf16"}}
    z3 = TrainingJob.from_dict({**plain, "layout": {**base["layout"], "zero_stage": 3}})
    z1 = TrainingJob.from_dict({**plain, "layout": {**base["layout"], "zero_stage": 1}})
    assert _host_per_micro_batch(z3, plat)[0] == pytest.approx(_host_per_micro_batch(z1, plat)[0])


def test_host_keys_are_validated():
    good = {"layer_seconds": 1e-3, "micro_batch_seconds": 1e-3}
    assert HostCosts.from_dict(good, "p.toml").collective_call_seconds == 0.0
    assert HostCosts.from_dict({**good, "collective_seconds": 3e-5}, "p.toml").collective_call_seconds == 3e-5
    with pytest.raises(BundleError, match="host.fsdp_layer_seconds"):
        HostCosts.from_dict({**good, "fsdp_layer_seconds": 5.0}, "p.toml")
    with pytest.raises(BundleError, match="host.zero3_layer_seconds"):
        HostCosts.from_dict({**good, "zero3_layer_seconds": -1.0}, "p.toml")


def test_a_compiled_model_issues_its_layers_at_the_measured_share():
    from predictor import predict
    from predictor.host import COMPILED_LAYER_HOST_RATIO
    plat = load_platform("dgx-h100")
    eager = _job()
    compiled = eager.replace(run={"compile": True})
    h = plat.host
    saved = _host_per_micro_batch(eager, plat)[0] - _host_per_micro_batch(compiled, plat)[0]
    # Only the layers' issue time shrinks; the micro-batch's own (embedding, loss) stays.
    assert saved == pytest.approx(4 * h.layer_seconds * (1 - COMPILED_LAYER_HOST_RATIO))
    # A host-bound step gets faster; the device's work is costed as eager's.
    assert predict(compiled, plat).iteration_seconds < predict(eager, plat).iteration_seconds
    with pytest.raises(Exception, match="run.compile"):
        TrainingJob.from_dict({"model": {"layers": 4, "hidden": 512, "heads": 8, "seq_len": 1024},
                               "run": {"compile": "sometimes"}})
