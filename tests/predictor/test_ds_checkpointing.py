"""DeepSpeed's activation-checkpointing options (layout.partition_activations, checkpoint_in_cpu,
checkpoint_sync_each_layer): validation, memory, and the time each adds, against figures computed
here from DeepSpeed's mechanism (predictor/checkpointing.py)."""
from __future__ import annotations

import pytest

from predictor import JobError, TrainingJob, load_platform, predict
from predictor import checkpointing, memory
from predictor.network import ring_seconds

# A GPT-NeoX 20B-shaped job inside one 8-GPU node: tp 4, pp 2, device-bound.
_MODEL = {"layers": 44, "hidden": 6144, "heads": 64, "seq_len": 2048}
_LAYOUT = {"pp": 2, "tp": 4, "dp": 1, "micro_batch": 4, "micro_batches": 8, "recompute": "full"}


def _job(run=None, **layout):
    return TrainingJob.from_dict({"model": dict(_MODEL), "layout": {**_LAYOUT, **layout},
                                  "run": {"framework": "neox", "train_iters": 10, **(run or {})}})


@pytest.fixture(scope="module")
def h100():
    return load_platform("dgx-h100")


def test_a_misspelt_key_is_refused_with_a_suggestion():
    with pytest.raises(JobError) as exc:
        _job(partition_activation=True)
    assert exc.value.key == "layout.partition_activation"
    assert "partition_activations" in str(exc.value)


def test_a_non_boolean_value_names_the_key():
    with pytest.raises(JobError) as exc:
        _job(checkpoint_in_cpu="yes")
    assert exc.value.key == "layout.checkpoint_in_cpu"


@pytest.mark.parametrize("framework", ["megatron", "nemo", "torchtitan", "llm-foundry"])
def test_frameworks_without_deepspeed_checkpointing_refuse_the_keys(framework):
    with pytest.raises(JobError) as exc:
        TrainingJob.from_dict({"model": dict(_MODEL), "layout": {**_LAYOUT, "pp": 1, "dp": 2,
                                                                  "checkpoint_sync_each_layer": True},
                               "run": {"framework": framework}})
    assert exc.value.key == "layout.checkpoint_sync_each_layer"


def test_defaults_are_off_and_round_trip():
    job = _job()
    d = job.to_dict()["layout"]
    assert (d["partition_activations"], d["checkpoint_in_cpu"], d["checkpoint_sync_each_layer"]) == (False,) * 3
    on = _job(partition_activations=True, checkpoint_in_cpu=True, checkpoint_sync_each_layer=True)
    assert TrainingJob.from_dict(on.to_dict()) == on


def _layer_input_bytes(job):
    return 2 * job.layout.micro_batch * job.model.seq_len * job.model.hidden    # fp16, no SP


def test_memory_keeps_a_tp_slice_or_nothing_of_each_checkpoint():
    plain, part, cpu = _job(), _job(partition_activations=True), _job(checkpoint_in_cpu=True)
    est = [memory.stage_estimates(j.model, j.layout, "fp16", framework="neox") for j in (plain, part, cpu)]
    x = _layer_input_bytes(plain)
    for stage, layers in enumerate(predict_layers(plain)):
        held = memory.in_flight(plain.layout, stage) * layers * x
        a0, a1, a2 = (e[stage].activations for e in est)
        assert a0 - a1 == pytest.approx(held * (1 - 1 / 4), rel=1e-12)
        assert a0 - a2 == pytest.approx(held, rel=1e-12)
    # (this job's peak is its optimizer step's fp32 gradient copy, which the options do not touch)
    assert memory.estimate_job(part).activations < memory.estimate_job(plain).activations


def predict_layers(job):
    from predictor.recipe import stage_layers
    return stage_layers(job.model, job.layout)


def test_selective_partition_keeps_a_slice_of_q_k_v():
    job = _job(recompute="selective", run={"framework": "megatron-deepspeed"})
    part = _job(recompute="selective", partition_activations=True, run={"framework": "megatron-deepspeed"})
    qkv = 2 * 4 * 2048 * (64 + 2 * 64) * 96 / 4          # fp16 Q, K, V per TP rank
    got = memory.layer_activation_bytes(job.model, job.layout, "fp16") \
        - memory.layer_activation_bytes(part.model, part.layout, "fp16")
    assert got == pytest.approx(qkv * (1 - 1 / 4), rel=1e-12)


def _stage0(job, plat):
    p = predict(job, plat)
    st = p.details.stages
    assert st.host_wait_seconds[0] == 0.0          # device-bound: the device path is what moves
    return p, st.forward_seconds[0], st.backward_seconds[0], st.layers[0]


def test_partition_adds_the_tp_all_gather_and_the_slice_copies(h100):
    p0, f0, b0, n = _stage0(_job(), h100)
    p1, f1, b1, _ = _stage0(_job(partition_activations=True), h100)
    shard = 4 * 2048 * 6144 / 4
    gather = ring_seconds(h100.links, "allgather", shard, 1, 4)       # one node, the TP group of 4
    hbm = h100.gpu.memory_gbps * 1e9
    assert f1 - f0 == pytest.approx(n * 2 * 2 * shard / hbm, rel=1e-9)
    assert b1 - b0 == pytest.approx(n * (gather + 2 * (4 * shard + 2 * shard) / hbm), rel=1e-9)
    assert p1.breakdown.tp_allreduce_seconds > p0.breakdown.tp_allreduce_seconds
    assert p1.iteration_seconds > p0.iteration_seconds


def test_cpu_checkpointing_pays_a_pageable_copy_each_way(h100):
    _, f0, b0, n = _stage0(_job(), h100)
    _, f1, b1, _ = _stage0(_job(checkpoint_in_cpu=True), h100)
    gbps, known = checkpointing.host_link_gbps(h100.gpu.name)
    assert known and gbps == 64.0
    to_host, to_device, _ = checkpointing.offload_gbps(h100.gpu.name)
    # The measured pageable copies, far below the link: the host's pages set them.
    assert (to_host, to_device) == (checkpointing.PAGEABLE_D2H_GBPS, checkpointing.PAGEABLE_H2D_GBPS)
    assert to_host < to_device < gbps
    wait = checkpointing.SYNC_ROUND_TRIP_SECONDS + h100.host.launch_seconds
    assert f1 - f0 == pytest.approx(n * (2 * 4 * 2048 * 6144 / (to_host * 1e9) + wait), rel=1e-9)
    assert b1 - b0 == pytest.approx(n * (2 * 4 * 2048 * 6144 / (to_device * 1e9) + wait), rel=1e-9)


def test_the_pageable_rates_are_the_committed_measurement():
    import json
    from pathlib import Path
    data = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h100-lent" / "host-link"
                       / "host-link.json").read_text())
    rates = {}
    for r in data["rows"]:
        rates.setdefault(r["copy"], []).append(r["gbps"])
    # The shipped figure is the slower of the sizes measured, to 3 significant figures.
    assert checkpointing.PAGEABLE_D2H_GBPS == float(f"{min(rates['d2h_pageable']):.3g}")
    assert checkpointing.PAGEABLE_H2D_GBPS == float(f"{min(rates['h2d_pageable']):.3g}")
    assert min(rates["d2h_pinned"]) > 10 * checkpointing.PAGEABLE_D2H_GBPS


def test_sync_each_layer_costs_four_waits_per_layer(h100):
    p0, f0, b0, n = _stage0(_job(), h100)
    p1, f1, b1, _ = _stage0(_job(checkpoint_sync_each_layer=True), h100)
    wait = checkpointing.SYNC_ROUND_TRIP_SECONDS + h100.host.launch_seconds
    assert (f1 - f0) + (b1 - b0) == pytest.approx(n * 4 * wait, rel=1e-9)
    assert p1.iteration_seconds > p0.iteration_seconds


def test_options_without_recompute_cost_nothing_and_say_so(h100):
    plain = predict(_job(recompute="none"), h100)
    both = predict(_job(recompute="none", partition_activations=True, checkpoint_sync_each_layer=True), h100)
    assert both.iteration_seconds == plain.iteration_seconds
    note = [w for w in both.warnings if "layout.partition_activations" in w]
    assert note and "layout.checkpoint_sync_each_layer" in note[0] and "recompute" in note[0]
    assert not any("checkpointed layers only" in w for w in plain.warnings)


def test_partition_at_tp_1_only_clones_the_input(h100):
    one = {"tp": 1, "dp": 4}
    _, f0, b0, n = _stage0(_job(**one), h100)
    _, f1, b1, _ = _stage0(_job(**one, partition_activations=True), h100)
    assert f1 - f0 == pytest.approx(n * 2 * 2 * 4 * 2048 * 6144 / (h100.gpu.memory_gbps * 1e9), rel=1e-9)
    assert b1 == b0
    assert memory.estimate_job(_job(**one, partition_activations=True)).total == memory.estimate_job(_job(**one)).total


def test_an_unknown_gpu_gets_pcie_gen4_and_a_warning():
    assert checkpointing.host_link_gbps("Some Future GPU") == (checkpointing.DEFAULT_HOST_LINK_GBPS, False)
    assert checkpointing.host_link_gbps("NVIDIA GH200 480GB")[0] == 450.0
    assert checkpointing.host_link_gbps("NVIDIA A100-SXM4-80GB")[0] == 32.0


def _megatron(**layout):
    return TrainingJob.from_dict({"model": dict(_MODEL), "layout": {**_LAYOUT, "pp": 2, **layout},
                                  "run": {"framework": "megatron", "train_iters": 10}})


def test_megatron_distributes_full_recomputes_input_without_deepspeeds_copies(h100):
    _, f0, b0, n = _stage0(_megatron(), h100)
    _, f1, b1, _ = _stage0(_megatron(partition_activations=True), h100)
    shard = 4 * 2048 * 6144 / 4
    hbm = h100.gpu.memory_gbps * 1e9
    assert f1 - f0 == pytest.approx(n * 2 * 2 * shard / hbm, rel=1e-9)
    # all-gathered into an empty buffer: the collective alone
    assert b1 - b0 == pytest.approx(n * ring_seconds(h100.links, "allgather", shard, 1, 4), rel=1e-9)


@pytest.mark.parametrize("layout", [{"recompute": "selective"}, {"sequence_parallel": True}])
def test_megatron_partitioning_outside_full_recompute_without_sp_is_said_not_costed(h100, layout):
    plain, part = _megatron(**layout), _megatron(partition_activations=True, **layout)
    p0, p1 = predict(plain, h100), predict(part, h100)
    assert p1.iteration_seconds == p0.iteration_seconds
    assert memory.estimate_job(part).total == memory.estimate_job(plain).total
    assert any("layout.partition_activations: Megatron-core distributes" in w for w in p1.warnings)


def test_megatron_has_no_cpu_checkpointing_key():
    with pytest.raises(JobError) as exc:
        _megatron(checkpoint_in_cpu=True)
    assert exc.value.key == "layout.checkpoint_in_cpu" and "partition_activations only" in str(exc.value)
