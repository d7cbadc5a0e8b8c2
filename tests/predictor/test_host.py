"""Host costs that grow with a layer's collectives and with FSDP's per-layer hooks."""
from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from predictor import TrainingJob, load_platform
from predictor.errors import BundleError
from predictor.estimate import QuerySet, _plan
from predictor.host import HostCosts


SHIPPED = ("dgx-h100", "dgx-a100", "perlmutter-a100", "vista-gh200")
STACK_HOST_DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "stack-host"


def _stack_host_runs(pattern: str) -> list[dict]:
    """The committed bench_stack_host.py runs whose file names match ``pattern``, in order."""
    return [json.loads(p.read_text()) for p in sorted(STACK_HOST_DATA.glob(pattern))]


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
    from predictor.host import DEEPSPEED_ZERO_HOOK_LAYER_SECONDS
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
    # (ZeRO-3's hooks in place of the ZeRO-1 optimizer's gradient hooks.)
    assert extra == pytest.approx(4 * (plat.host.zero3_layer_seconds - DEEPSPEED_ZERO_HOOK_LAYER_SECONDS[1]))
    # A job that names no framework is charged neither.
    plain = {**base, "run": {"precision": "bf16"}}
    z3 = TrainingJob.from_dict({**plain, "layout": {**base["layout"], "zero_stage": 3}})
    z1 = TrainingJob.from_dict({**plain, "layout": {**base["layout"], "zero_stage": 1}})
    assert _host_per_micro_batch(z3, plat)[0] == pytest.approx(_host_per_micro_batch(z1, plat)[0])


@pytest.mark.parametrize("framework", ["deepspeed", "megatron-deepspeed", "neox"])
def test_deepspeeds_zero1_and_zero2_hooks_are_paid_per_layer_and_micro_batch(framework):
    from predictor.host import DEEPSPEED_ZERO_HOOK_LAYER_SECONDS, zero_hook_layer_seconds
    plat = load_platform("dgx-a100")
    assert 0 < DEEPSPEED_ZERO_HOOK_LAYER_SECONDS[1] < DEEPSPEED_ZERO_HOOK_LAYER_SECONDS[2]
    jobs = {z: _recompute_job("none", framework, zero_stage=z) for z in (0, 1, 2)}
    host = {z: _host_per_micro_batch(j, plat)[0] for z, j in jobs.items()}
    for z in (1, 2):
        assert zero_hook_layer_seconds(framework, z) == DEEPSPEED_ZERO_HOOK_LAYER_SECONDS[z]
        assert host[z] - host[0] == pytest.approx(4 * DEEPSPEED_ZERO_HOOK_LAYER_SECONDS[z])
    # Neither stage 0 nor 3 (ZeRO-3's hooks are zero3_layer_seconds), nor another framework's ZeRO.
    assert zero_hook_layer_seconds(framework, 0) == zero_hook_layer_seconds(framework, 3) == 0.0
    for other in ("", "megatron", "nemo", "torchtitan", "llm-foundry"):
        assert zero_hook_layer_seconds(other, 2) == 0.0
    # A full recomputation's repeated forward does not pass the gradient hooks again.
    full = {z: _host_per_micro_batch(_recompute_job("full", framework, zero_stage=z), plat)[0] for z in (0, 2)}
    assert full[2] - full[0] == pytest.approx(host[2] - host[0])


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


def _recompute_job(recompute: str, framework: str, layers: int = 4, zero_stage: int = 0) -> TrainingJob:
    return TrainingJob.from_dict({"model": {"layers": layers, "hidden": 512, "heads": 8, "seq_len": 1024},
                                  "layout": {"micro_batch": 1, "micro_batches": 2, "recompute": recompute,
                                             "zero_stage": zero_stage},
                                  "run": {"precision": "bf16", **({"framework": framework} if framework else {})}})


@pytest.mark.parametrize("framework,wrapper", [("", "torch"), ("megatron", "megatron"), ("nemo", "megatron"),
                                               ("neox", "deepspeed"), ("megatron-deepspeed", "deepspeed"),
                                               ("torchtitan", "torch_fsdp"), ("llm-foundry", "torch_fsdp")])
def test_full_recomputation_pays_the_forward_and_its_frameworks_wrapper_per_layer(framework, wrapper):
    from predictor.host import checkpoint_wrapper_for, layer_extra_seconds
    plat = load_platform("dgx-h100")
    h = plat.host
    forward = h.layer_forward_seconds + layer_extra_seconds(framework)[1]   # the framework's own layer
    assert checkpoint_wrapper_for(framework, "full") == wrapper
    assert checkpoint_wrapper_for(framework, "none") == ""
    # Without FSDP a block's full AC is PyTorch's plain wrapper: no FSDP hooks in its recompute.
    assert checkpoint_wrapper_for(framework, "full", fsdp=False) == ("torch" if wrapper == "torch_fsdp" else wrapper)
    assert h.checkpoint_layer_seconds[wrapper] > 0
    # TorchTitan's and llm-foundry's blocks are FSDP-sharded (ZeRO-3) as they run; their hooks
    # cost the same with and without recomputation.
    zero = 3 if wrapper == "torch_fsdp" else 0
    none = _host_per_micro_batch(_recompute_job("none", framework, zero_stage=zero), plat)[0]
    full = _host_per_micro_batch(_recompute_job("full", framework, zero_stage=zero), plat)[0]
    assert full - none == pytest.approx(4 * (forward + h.checkpoint_layer_seconds[wrapper]))
    # A platform file written before the wrappers were measured charges the forward alone, as before.
    old = dataclasses.replace(plat, host=dataclasses.replace(h, checkpoint_layer_seconds={}))
    assert _host_per_micro_batch(_recompute_job("full", framework, zero_stage=zero), old)[0] - none == \
        pytest.approx(4 * forward)


@pytest.mark.parametrize("framework", ["megatron-deepspeed", "neox"])
def test_megatrons_own_layer_adds_its_measured_python_per_layer(framework):
    from predictor import predict
    from predictor.host import (MEGATRON_LAYER_EXTRA_SECONDS, MEGATRON_LAYER_FORWARD_EXTRA_SECONDS,
                                layer_extra_seconds)
    plat = load_platform("dgx-a100")
    assert layer_extra_seconds(framework) == (MEGATRON_LAYER_EXTRA_SECONDS, MEGATRON_LAYER_FORWARD_EXTRA_SECONDS)
    assert 0 < MEGATRON_LAYER_FORWARD_EXTRA_SECONDS < MEGATRON_LAYER_EXTRA_SECONDS
    # The same job as DeepSpeed's (a user's own model: the reference layer), pipeline engine and
    # wrapper alike at pp = 2: only the layers' issue time differs, by the measured extra per layer.
    ds = _recompute_job("none", "deepspeed").replace(layout={"pp": 2})
    own = ds.replace(run={"framework": framework})
    per_stage = 2                      # 4 layers over 2 stages
    for a, b in zip(_host_per_micro_batch(own, plat), _host_per_micro_batch(ds, plat)):
        assert a - b == pytest.approx(per_stage * MEGATRON_LAYER_EXTRA_SECONDS)
    # Full recomputation repeats the forward, and its extra with it.
    full_own = own.replace(layout={"recompute": "full"})
    full_ds = ds.replace(layout={"recompute": "full"})
    for a, b in zip(_host_per_micro_batch(full_own, plat), _host_per_micro_batch(full_ds, plat)):
        assert a - b == pytest.approx(per_stage * (MEGATRON_LAYER_EXTRA_SECONDS + MEGATRON_LAYER_FORWARD_EXTRA_SECONDS))
    # This small host-bound job takes longer; frameworks with other layers do not move.
    assert predict(own, plat).iteration_seconds > predict(ds, plat).iteration_seconds
    for other in ("", "deepspeed", "megatron", "nemo", "torchtitan", "llm-foundry"):
        assert layer_extra_seconds(other) == (0.0, 0.0)


def test_selective_recomputation_pays_one_wrapper_per_layer():
    plat = load_platform("dgx-h100")
    h = plat.host
    # Megatron checkpoints the attention core once per layer (its recomputed kernels are few).
    none = _host_per_micro_batch(_recompute_job("none", "megatron"), plat)[0]
    sel = _host_per_micro_batch(_recompute_job("selective", "megatron"), plat)[0]
    assert sel - none == pytest.approx(4 * h.checkpoint_layer_seconds["megatron"])
    # TorchTitan's op-level SAC wraps the whole layer: its code runs again in the backward.
    none = _host_per_micro_batch(_recompute_job("none", "torchtitan"), plat)[0]
    sac = _host_per_micro_batch(_recompute_job("selective", "torchtitan"), plat)[0]
    assert sac - none == pytest.approx(4 * (h.layer_forward_seconds + h.checkpoint_layer_seconds["torch_op_sac"]))
    # A job that names no framework recomputes selectively as Megatron does (the attention core).
    none = _host_per_micro_batch(_recompute_job("none", ""), plat)[0]
    sel = _host_per_micro_batch(_recompute_job("selective", ""), plat)[0]
    assert sel - none == pytest.approx(4 * h.checkpoint_layer_seconds["megatron"])


def test_llm_foundry_zero2_pays_the_measured_share_of_the_fsdp_hooks():
    from predictor.host import FSDP1_SHARD_GRAD_OP_HOOK_RATIO
    plat = load_platform("dgx-h100")
    base = {"model": {"layers": 4, "hidden": 512, "heads": 8, "seq_len": 1024},
            "layout": {"dp": 8, "micro_batch": 1, "micro_batches": 1, "recompute": "none"},
            "run": {"precision": "bf16", "framework": "llm-foundry"}}

    def host(stage: int, framework: str = "llm-foundry") -> float:
        job = TrainingJob.from_dict({**base, "layout": {**base["layout"], "zero_stage": stage},
                                     "run": {**base["run"], "framework": framework}})
        return _host_per_micro_batch(job, plat)[0]
    assert 0 < FSDP1_SHARD_GRAD_OP_HOOK_RATIO < 1
    assert host(2) - host(1) == pytest.approx(4 * FSDP1_SHARD_GRAD_OP_HOOK_RATIO * plat.host.fsdp_layer_seconds)
    assert host(3) - host(1) == pytest.approx(4 * plat.host.fsdp_layer_seconds)
    # TorchTitan's FSDP2 was not measured without its reshard: its ZeRO-2 pays the whole figure.
    assert host(2, "torchtitan") - host(1, "torchtitan") == pytest.approx(4 * plat.host.fsdp_layer_seconds)


def test_a_host_table_without_the_fsdp_wrapper_costs_it_as_torch_s():
    # A site's perf-calibrate host measures the CPU-side wrappers only: TorchTitan's full AC is then
    # costed as PyTorch's plain non-reentrant wrapper, not as nothing.
    plat = load_platform("dgx-h100")
    h = plat.host
    cpu_only = {w: v for w, v in h.checkpoint_layer_seconds.items() if w != "torch_fsdp"}
    site = dataclasses.replace(plat, host=dataclasses.replace(h, checkpoint_layer_seconds=cpu_only))
    none = _host_per_micro_batch(_recompute_job("none", "torchtitan", zero_stage=3), site)[0]
    full = _host_per_micro_batch(_recompute_job("full", "torchtitan", zero_stage=3), site)[0]
    assert full - none == pytest.approx(4 * (h.layer_forward_seconds + h.checkpoint_layer_seconds["torch"]))
    # ... where the shipped table has it, FSDP-sharded full AC pays the GPU's figure.
    shipped = _host_per_micro_batch(_recompute_job("full", "torchtitan", zero_stage=3), plat)[0]
    assert shipped - none == pytest.approx(4 * (h.layer_forward_seconds + h.checkpoint_layer_seconds["torch_fsdp"]))


def test_fsdp1_pays_its_accumulation_share_on_each_micro_batch_after_the_first():
    from predictor.host import FSDP1_ACCUMULATION_HOOK_RATIO, fsdp_hook_share
    plat = load_platform("dgx-h100")
    base = {"model": {"layers": 4, "hidden": 512, "heads": 8, "seq_len": 1024},
            "layout": {"dp": 8, "micro_batch": 1, "zero_stage": 3, "recompute": "none"},
            "run": {"precision": "bf16"}}

    def host(framework: str, micro_batches: int) -> float:
        job = TrainingJob.from_dict({**base, "layout": {**base["layout"], "micro_batches": micro_batches},
                                     "run": {**base["run"], "framework": framework}})
        return _host_per_micro_batch(job, plat)[0]
    assert 0 < FSDP1_ACCUMULATION_HOOK_RATIO < 1
    assert fsdp_hook_share("llm-foundry", 3, 1) == 1.0
    assert fsdp_hook_share("llm-foundry", 3, 4) == pytest.approx(1 + 0.75 * FSDP1_ACCUMULATION_HOOK_RATIO)
    assert fsdp_hook_share("torchtitan", 3, 4) == 1.0
    # Per micro-batch, averaged over the step: 3 of 4 micro-batches pay it on each of 4 layers.
    extra = host("llm-foundry", 4) - host("llm-foundry", 1)
    assert extra == pytest.approx(4 * 0.75 * FSDP1_ACCUMULATION_HOOK_RATIO * plat.host.fsdp_layer_seconds)
    assert host("torchtitan", 4) == pytest.approx(host("torchtitan", 1))


def test_checkpoint_table_is_validated():
    good = {"layer_seconds": 1e-3, "micro_batch_seconds": 1e-3}
    h = HostCosts.from_dict({**good, "checkpoint_layer_seconds": {"megatron": 2e-4}}, "p.toml")
    assert h.checkpoint_layer_seconds == {"megatron": 2e-4}
    assert h.to_dict()["checkpoint_layer_seconds"] == {"megatron": 2e-4}
    assert HostCosts.from_dict(good, "p.toml").checkpoint_layer_seconds == {}
    with pytest.raises(BundleError, match=r"unknown \[host.checkpoint_layer_seconds\] wrappers \['apex'\]"):
        HostCosts.from_dict({**good, "checkpoint_layer_seconds": {"apex": 1e-4}}, "p.toml")
    with pytest.raises(BundleError, match="host.checkpoint_layer_seconds.torch must be"):
        HostCosts.from_dict({**good, "checkpoint_layer_seconds": {"torch": 250.0}}, "p.toml")
    with pytest.raises(BundleError, match=r"\[host.checkpoint_layer_seconds\] must be a table"):
        HostCosts.from_dict({**good, "checkpoint_layer_seconds": 1e-4}, "p.toml")


def test_shipped_platforms_carry_the_measured_checkpoint_wrappers():
    # Each shipped [host] carries every wrapper as the lent GPU node's host paid it: Megatron's and
    # DeepSpeed's as the median of the committed --device cuda --checkpoint runs that timed them (a
    # run that was not written back, build_platforms.py --only host-priors, fails here); op-level
    # SAC's, full AC around FSDP blocks and PyTorch's plain wrapper from the lent GPU's real steps
    # (tests/calibrate/test_stack_host.py checks them).
    from predictor.host import CHECKPOINT_WRAPPERS
    runs = _stack_host_runs("checkpoint-h100-*.json")
    assert all("H100" in r["provenance"]["gpu"] and r["checkpoint"]["layer"] == "gpt" for r in runs)
    for name in SHIPPED:
        host = load_platform(name).host
        assert set(host.checkpoint_layer_seconds) == set(CHECKPOINT_WRAPPERS), name
        for w in ("megatron", "deepspeed"):
            measured = [r["checkpoint"]["checkpoint_layer_seconds"][w] for r in runs
                        if w in r["checkpoint"]["checkpoint_layer_seconds"]]
            assert len(measured) >= 3, w
            assert host.checkpoint_layer_seconds[w] == pytest.approx(max(0.0, statistics.median(measured)),
                                                                     rel=1e-4), (name, w)


def test_shipped_platforms_carry_zero3s_hooks_as_the_gpu_node_measured_them():
    # The GPU node's figure around a transformer layer with its weight matrices partitioned, as a
    # real layer's are: a run not written back (build_platforms.py --only host-priors) fails here.
    runs = _stack_host_runs("zero3-layer-transformer-partitioned-h100-*.json")
    assert len(runs) >= 3 and all(r["provenance"]["backend"] == "nccl" and "H100" in r["provenance"]["gpu"]
                                  for r in runs)
    assert all(r["deepspeed_zero3"]["layer"] == "transformer"
               and 0 < r["deepspeed_zero3"]["persistence_threshold"] < 64 * 64 for r in runs)
    median = statistics.median(r["deepspeed_zero3"]["zero3_hook_layer_seconds"] for r in runs)
    # The same node's runs around the tiny block (nothing partitioned) cost less: the partitioned
    # weights' gathers and releases are what a real layer adds.
    blocks = _stack_host_runs("zero3-layer-block-h100-*.json")
    assert blocks and all(b["deepspeed_zero3"]["layer"] == "block" for b in blocks)
    assert median > statistics.median(b["deepspeed_zero3"]["zero3_hook_layer_seconds"] for b in blocks)
    for name in SHIPPED:
        assert load_platform(name).host.zero3_layer_seconds == pytest.approx(median, rel=1e-4), name


def test_shipped_platforms_carry_the_gpu_nodes_measured_collective_cost():
    # The TP collective's host cost is the lent H100 node's, through NCCL (bench_stack_host.py
    # --device cuda): a run that was not written back (build_platforms.py --only host-priors) fails.
    runs = _stack_host_runs("nccl-h100-*.json")
    assert len(runs) >= 2 and all(r["provenance"]["backend"] == "nccl" and "H100" in r["provenance"]["gpu"]
                                  for r in runs)
    median = statistics.median(r["tp"]["collective_seconds"] for r in runs)
    for name in SHIPPED:
        assert load_platform(name).host.collective_seconds == pytest.approx(median, rel=1e-3), name
