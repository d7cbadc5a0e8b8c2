"""calibrate/stack_host.py: the TP-collective, FSDP and checkpoint-wrapper host measurements run and
measure what they say."""
from __future__ import annotations

import math

import pytest

from calibrate.stack_files import OTHER_HOST_STEP_FILES
from calibrate.stack_runs import split_label


def _stack_host():
    """calibrate.stack_host, skipping the test (alone) where torch is absent."""
    pytest.importorskip("torch", reason="the host measurements run torch (the calibrate extra)")
    from calibrate import stack_host
    return stack_host


def test_tp_layer_is_the_plain_layer_plus_its_collectives(one_rank):
    import torch

    stack_host = _stack_host()
    torch.manual_seed(0)
    plain, tp = stack_host.TpBlock(False), stack_host.TpBlock(True)
    tp.load_state_dict(plain.state_dict())
    x = torch.randn(stack_host.TOKENS, stack_host.HIDDEN, requires_grad=True)
    # On one rank an all-reduce is the identity: same values, forward and backward.
    assert torch.allclose(plain(x), tp(x))
    gp = torch.autograd.grad(plain(x).sum(), x)[0]
    gt = torch.autograd.grad(tp(x).sum(), x)[0]
    assert torch.allclose(gp, gt)
    r = stack_host.tp_collective_costs((1, 2), repeats=3, rounds=1)
    assert set(r) >= {"collective_seconds", "issue_seconds", "layer_seconds_with", "layer_seconds_without"}
    assert all(math.isfinite(r[k]) for k in ("collective_seconds", "issue_seconds"))
    assert r["issue_seconds"] > 0


def test_fsdp_and_ddp_slopes_are_measured(one_rank):
    stack_host = _stack_host()
    r = stack_host.fsdp_costs((1, 2), repeats=3, rounds=1)
    assert r["fsdp_hook_layer_seconds"] == pytest.approx(r["fsdp_layer_seconds"] - r["ddp_layer_seconds"])
    assert set(r["per_config"]) == {"ddp_1", "ddp_2", "fsdp_1", "fsdp_2"}
    assert all(v > 0 for v in r["per_config"].values())


@pytest.fixture
def fake_two_ranks():
    stack_host = _stack_host()
    import torch.distributed as dist
    if dist.is_initialized():
        pytest.skip("a process group is already up in this session")
    stack_host.fake_group()
    yield
    dist.destroy_process_group()


def test_fsdp1_fsdp2_and_ddp_slopes_are_measured(fake_two_ranks):
    """FSDP1 really shards on the fake 2-rank group (a FULL_SHARD unit per block), and each hook
    figure is its slope less DDP's."""
    stack_host = _stack_host()
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    units = [m for m in stack_host._fsdp1_model(2).modules() if isinstance(m, FSDP)]
    assert len(units) == 3 and all(u.sharding_strategy == ShardingStrategy.FULL_SHARD for u in units)
    units = [m for m in stack_host._fsdp1_model(2, "SHARD_GRAD_OP").modules() if isinstance(m, FSDP)]
    assert len(units) == 3 and all(u.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP for u in units)
    r = stack_host.fsdp1_costs((1, 2), repeats=3, rounds=1)
    slope, hooks = r["layer_seconds"], r["hook_layer_seconds"]
    for kind in ("fsdp1", "fsdp1_zero2", "fsdp2"):
        assert hooks[kind] == pytest.approx(slope[kind] - slope["ddp"])
    assert r["fsdp1_over_fsdp2"] == pytest.approx(hooks["fsdp1"] / hooks["fsdp2"])
    assert r["fsdp1_zero2_over_fsdp1"] == pytest.approx(hooks["fsdp1_zero2"] / hooks["fsdp1"])
    assert set(r["per_config"]) == {f"{k}_{n}" for k in ("ddp", "fsdp1", "fsdp1_zero2", "fsdp2") for n in (1, 2)}
    assert all(v > 0 for v in r["per_config"].values())


def test_gpu_fsdp_layer_cost_is_the_slope_difference_less_the_copies():
    stack_host = _stack_host()
    from predictor.operators import BYTES_PER_ELEMENT
    from predictor.recipe import fsdp2_shard_copies, layer_parameters
    from predictor.job import TrainingJob

    job = {"model": {"layers": 2, "hidden": 1024, "heads": 8, "seq_len": 1024, "attention": "flash"},
           "layout": {"micro_batch": 1, "micro_batches": 4, "zero_stage": 1}, "run": {"precision": "bf16"}}

    def row(stack: str, layers: int, seconds: float) -> dict:
        j = {k: dict(v) for k, v in job.items()}
        j["model"]["layers"] = layers
        return {"stack": stack, "job": j, "measured_iteration_seconds": seconds}

    # FSDP2 10 ms per layer per step, DDP 6 ms: 1 ms per layer per micro-batch before the copies.
    rows = [row("fsdp", n, 0.02 + 0.010 * n) for n in (2, 8, 16)] + [row("ddp", n, 0.01 + 0.006 * n) for n in (2, 8, 16)]
    rows += [row("pytorch", 4, 1.0), {**row("fsdp", 32, 9.0), "error": "OutOfMemoryError"}]
    out = stack_host.gpu_fsdp_layer_seconds(rows, 3.0e12)
    t = TrainingJob.from_dict({**job, "layout": {**job["layout"], "zero_stage": 3}, "run": {"precision": "bf16",
                                                                                         "framework": "torchtitan"}})
    c = fsdp2_shard_copies(t.layout, "torchtitan", "bf16", "fp32", BYTES_PER_ELEMENT)
    copies = layer_parameters(t.model, 1) * (c.forward_bytes + c.backward_bytes) / 3.0e12
    assert out["depths"] == [2, 8, 16] and out["micro_batches"] == 4
    assert out["fsdp_layer_seconds"] == pytest.approx(0.001 - copies)
    with pytest.raises(ValueError, match="two or more depths"):
        stack_host.gpu_fsdp_layer_seconds(rows[:3], 3.0e12)


def test_gpu_checkpoint_cost_is_the_slope_difference_less_one_forward():
    stack_host = _stack_host()
    job = {"model": {"layers": 2, "hidden": 1024, "heads": 8, "seq_len": 1024, "attention": "flash"},
           "layout": {"micro_batch": 1, "micro_batches": 4, "zero_stage": 1, "recompute": "none"},
           "run": {"precision": "bf16"}}

    def row(recompute: str, layers: int, seconds: float, micro_batches: int = 4) -> dict:
        j = {k: dict(v) for k, v in job.items()}
        j["model"]["layers"], j["layout"]["recompute"] = layers, recompute
        j["layout"]["micro_batches"] = micro_batches
        return {"stack": "fsdp", "job": j, "measured_iteration_seconds": seconds}

    # With op-level SAC 26 ms per layer per step, without 13 ms: 3.25 ms per layer and micro-batch.
    rows = [row("selective", n, 0.09 + 0.026 * n) for n in (8, 16)]
    rows += [row("none", n, 0.03 + 0.013 * n) for n in (2, 8, 16)] + [row("full", 8, 1.0), row("full", 16, 2.0)]
    # A repeat counts at its fastest; a 1-micro-batch series as deep loses to the 4-micro-batch one.
    rows += [row("selective", 8, 0.5), row("none", 8, 0.03 + 0.013 * 8 + 0.004)]
    rows += [row(r, n, 0.01 * n, micro_batches=1) for r in ("none", "selective") for n in (8, 16)]
    out = stack_host.gpu_checkpoint_layer_seconds(rows, "selective", layer_forward_seconds=0.00025)
    assert out["depths"] == [8, 16] and out["micro_batches"] == 4
    assert out["torch_op_sac"] == pytest.approx(0.00325 - 0.00025)
    # Full AC around the FSDP2 block: (1.0 s per 8 layers) / 8 / 4 micro-batches.
    full = stack_host.gpu_checkpoint_layer_seconds(rows, "full", layer_forward_seconds=0.0)
    assert full["torch_fsdp"] == pytest.approx((1.0 / 8 - 0.013) / 4)
    with pytest.raises(ValueError, match="two or more depths"):
        stack_host.gpu_checkpoint_layer_seconds(rows[:1] + rows[2:7], "selective", layer_forward_seconds=0.0)
    with pytest.raises(ValueError, match="recompute 'offload'"):
        stack_host.gpu_checkpoint_layer_seconds(rows, "offload", layer_forward_seconds=0.0)


def test_the_paired_checkpoint_cost_is_the_median_same_round_difference_less_one_forward():
    stack_host = _stack_host()

    def row(label: str, layers: int, seconds: float, round_index: int, micro_batches: int = 2) -> dict:
        stack, recompute, keeps_rng = split_label(label)
        job = {"model": {"layers": layers}, "layout": {"micro_batches": micro_batches,
                                                       "recompute": recompute or "none"}}
        r = {"stack": stack, "name": f"L{layers} m{micro_batches}", "job": job, "round": round_index,
             "measured_iteration_seconds": seconds}
        return r if keeps_rng else {**r, "preserve_rng_state": False}

    # The host drifts 1.5x between rounds; within a round full AC adds 3 ms per layer and
    # micro-batch, 2.8 ms without the RNG state.  A slope over the fastest steps would mix rounds.
    rows = []
    for round_index, drift in ((0, 1.0), (1, 1.5)):
        for layers in (2, 8):
            plain = drift * 0.001 * layers * 2
            rows += [row("ddp", layers, plain, round_index),
                     row("ddp+full", layers, plain + 0.003 * layers * 2, round_index),
                     row("ddp+full:norng", layers, plain + 0.0028 * layers * 2, round_index)]
    rows.append({**row("ddp+full", 8, 9.0, 2), "error": "OutOfMemoryError"})   # no partner, and an error
    out = stack_host.gpu_paired_checkpoint_layer_seconds([rows], "ddp", layer_forward_seconds=0.0005)
    assert out["pairs"] == 8 and out["rng_pairs"] == 4
    assert out["seconds"] == pytest.approx(0.0029 - 0.0005)
    assert out["rng_seconds"] == pytest.approx(-0.0002)
    # Rows pair within their own file only.
    plain = [r for r in rows if r["job"]["layout"]["recompute"] == "none"]
    full = [r for r in rows if r["job"]["layout"]["recompute"] == "full"]
    with pytest.raises(ValueError, match="under both ddp and ddp\\+full"):
        stack_host.gpu_paired_checkpoint_layer_seconds([plain, full], "ddp", 0.0)


def test_the_shipped_gpu_wrapper_costs_are_the_lent_gpus_measurement():
    """Every shipped platform's torch_op_sac, torch_fsdp and torch are the lent H100's interleaved
    steps with and without them (scripts/build_platforms.py), not the CPU benchmark's figures."""
    import json
    from pathlib import Path

    from predictor import load_platform
    stack_host = _stack_host()
    data = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h100-lent"
    rows = json.loads((data / "stacks" / "hseries.json").read_text())["rows"]
    forward = load_platform("dgx-h100").host.layer_forward_seconds
    measured = {}
    for recompute, wrapper in stack_host.GPU_CHECKPOINT_WRAPPERS.items():
        measured[wrapper] = stack_host.gpu_checkpoint_layer_seconds(rows, recompute, forward)[wrapper]
    # PyTorch's plain wrapper: DDP's steps with and without full AC, paired within each round.
    files = [json.loads((data / "stacks" / name).read_text())["rows"] for name in OTHER_HOST_STEP_FILES]
    measured["torch"] = stack_host.gpu_paired_checkpoint_layer_seconds(files, "ddp", forward)["seconds"]
    for name in ("dgx-h100", "dgx-a100", "perlmutter-a100", "vista-gh200"):
        costs = load_platform(name).host.checkpoint_layer_seconds
        for wrapper, seconds in measured.items():
            assert costs[wrapper] == pytest.approx(seconds, abs=1e-8), (name, wrapper)
    # The GPU node's host pays more for each wrapper than the CPU benchmark's plain one.
    import statistics
    cpu = statistics.median(json.loads(p.read_text())["checkpoint"]["checkpoint_layer_seconds"]["torch"]
                            for p in (data.parent / "stack-host").glob("checkpoint-[0-9]*.json"))
    assert min(measured.values()) > 2 * cpu


def test_fsdp1_accumulation_ratio_is_the_slope_over_layers_times_later_micro_batches():
    stack_host = _stack_host()
    job = {"model": {"layers": 2, "hidden": 1024, "heads": 8, "seq_len": 1024, "attention": "flash"},
           "layout": {"micro_batch": 1, "micro_batches": 4, "zero_stage": 1, "recompute": "none"},
           "run": {"precision": "bf16"}}

    def row(stack: str, layers: int, micro_batches: int, seconds: float) -> dict:
        j = {k: dict(v) for k, v in job.items()}
        j["model"]["layers"], j["layout"]["micro_batches"] = layers, micro_batches
        return {"stack": stack, "job": j, "measured_iteration_seconds": seconds}

    rows = []
    for n in (2, 8, 16):
        for m in (1, 4):
            fsdp = 0.01 + m * (0.002 + 0.004 * n)
            rows += [row("fsdp", n, m, fsdp), row("ddp", n, m, 0.01 + m * (0.002 + 0.002 * n)),
                     row("fsdp1", n, m, fsdp + 0.001 * n * (m - 1))]
    rows.append(row("fsdp1", 16, 4, 9.0))           # a slower repeat: the faster counts
    out = stack_host.gpu_fsdp1_accumulation_ratio(rows, 1e18)
    assert out["pairs"] == 6 and out["accumulation_layer_seconds"] == pytest.approx(0.001)
    assert out["ratio"] == pytest.approx(0.001 / out["fsdp_layer_seconds"])
    with pytest.raises(ValueError, match="2 or more micro-batches"):
        stack_host.gpu_fsdp1_accumulation_ratio([r for r in rows if r["job"]["layout"]["micro_batches"] == 1], 1e18)


def test_the_shipped_fsdp1_accumulation_ratio_is_the_committed_measurement():
    import json
    from pathlib import Path

    from predictor import load_platform
    from predictor.host import FSDP1_ACCUMULATION_HOOK_RATIO
    stack_host = _stack_host()
    rows = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h100-lent" / "stacks"
                       / "hseries.json").read_text())["rows"]
    out = stack_host.gpu_fsdp1_accumulation_ratio(rows, load_platform("dgx-h100").gpu.memory_gbps * 1e9)
    assert FSDP1_ACCUMULATION_HOOK_RATIO == pytest.approx(out["ratio"], abs=5e-4)


def test_the_compiled_layer_ratio_is_the_committed_measurement():
    stack_host = _stack_host()
    import json
    from pathlib import Path

    from predictor.host import COMPILED_LAYER_HOST_RATIO
    rows = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h100-lent" / "stacks"
                       / "compile.json").read_text())["rows"]
    out = stack_host.gpu_compiled_layer_ratio(rows)
    assert out["depths"] == [2, 8]
    assert COMPILED_LAYER_HOST_RATIO == pytest.approx(out["ratio"], abs=5e-4)
    # Synthetic: 3 ms per layer compiled against 6 eager is a ratio of one half.
    job = rows[0]["job"]

    def row(stack: str, layers: int, seconds: float) -> dict:
        j = {k: dict(v) for k, v in job.items()}
        j["model"]["layers"] = layers
        return {"stack": stack, "job": j, "measured_iteration_seconds": seconds}
    synthetic = [row("ddp", 2, 0.02), row("ddp", 6, 0.044), row("compile", 2, 0.01), row("compile", 6, 0.022)]
    assert stack_host.gpu_compiled_layer_ratio(synthetic)["ratio"] == pytest.approx(0.5)


def test_deepspeed_zero3_hooks_are_measured_per_layer(one_rank):
    import torch

    stack_host = _stack_host()
    pytest.importorskip("deepspeed", reason="DeepSpeed's ZeRO-3 is what is measured (no dependency of perfcast)")
    linear = torch.nn.functional.linear
    r = stack_host.deepspeed_zero3_costs((1, 2), repeats=3, rounds=1)
    assert set(r["per_config"]) == {"zero0_1", "zero0_2", "zero3_1", "zero3_2"}
    assert all(v > 0 for v in r["per_config"].values())
    assert r["zero3_hook_layer_seconds"] == pytest.approx(r["zero3_layer_seconds"] - r["zero0_layer_seconds"])
    assert r["layer"] == "block"
    # ZeRO-3's engine replaced F.linear while it ran; the process gets torch's back.
    assert torch.nn.functional.linear is linear
    assert r["persistence_threshold"] is None
    t = stack_host.deepspeed_zero3_costs((1, 2), repeats=3, rounds=1, layer="transformer", persistence_threshold=257)
    assert t["layer"] == "transformer" and t["persistence_threshold"] == 257
    assert all(v > 0 for v in t["per_config"].values())
    with pytest.raises(ValueError, match="unknown layer 'mlp'"):
        stack_host.deepspeed_zero3_costs((1, 2), repeats=1, rounds=1, layer="mlp")


def test_deepspeed_zero1_and_zero2_hooks_are_measured_inside_a_step(one_rank):
    import os

    stack_host = _stack_host()
    pytest.importorskip("deepspeed", reason="DeepSpeed's ZeRO-1/2 optimizer is what is measured (no dependency "
                                            "of perfcast)")
    before = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    r = stack_host.deepspeed_zero12_costs((1, 2), repeats=3, rounds=1)
    assert set(r["per_config"]) == {f"zero{z}_{n}" for z in (0, 1, 2) for n in (1, 2)}
    assert all(v > 0 for v in r["per_config"].values())
    s = r["layer_seconds"]
    assert r["zero1_hook_layer_seconds"] == pytest.approx(s["zero1"] - s["zero0"])
    assert r["zero2_hook_layer_seconds"] == pytest.approx(s["zero2"] - s["zero0"])
    assert r["layer"] == "transformer"
    # The launcher's variables were the measurement's only.
    assert {k: os.environ.get(k) for k in before} == before


def test_shipped_zero_hooks_are_the_median_of_the_committed_runs():
    import json
    import statistics
    from pathlib import Path

    from predictor.host import DEEPSPEED_ZERO_HOOK_LAYER_SECONDS
    # The lent H100 node's runs (the engine on the GPU, one NCCL rank); the VM's, zero12-[0-9].json,
    # are kept for reference.
    files = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "stack-host").glob(
        "zero12-h100-*.json"))
    assert len(files) == 3
    data = [json.loads(f.read_text()) for f in files]
    assert all(d["provenance"]["backend"] == "nccl" and "H100" in d["provenance"]["gpu"] for d in data)
    runs = [d["deepspeed_zero12"] for d in data]
    for stage in (1, 2):
        hooks = [r[f"zero{stage}_hook_layer_seconds"] for r in runs]
        for r, h in zip(runs, hooks):
            assert h == pytest.approx(r["layer_seconds"][f"zero{stage}"] - r["layer_seconds"]["zero0"])
        assert DEEPSPEED_ZERO_HOOK_LAYER_SECONDS[stage] == pytest.approx(statistics.median(hooks), abs=5e-8)


def test_a_zero12_engine_never_reaches_the_accumulation_boundary(one_rank):
    stack_host = _stack_host()
    pytest.importorskip("deepspeed", reason="DeepSpeed's engine is what is built (no dependency of perfcast)")
    with stack_host._LauncherEnv():
        engine = stack_host._deepspeed_model(1, 2, layer="transformer", accumulate=True).engine
    assert engine.gradient_accumulation_steps() == stack_host.ACCUMULATE_FOREVER
    assert not engine.is_gradient_accumulation_boundary()


def test_the_transformer_block_holds_a_layers_modules():
    # What ZeRO-3's hooks see in a real layer: six modules with parameters (two LayerNorms, QKV,
    # the output projection, the MLP's two linears), twelve parameters, and the activation's shape.
    import torch

    stack_host = _stack_host()
    layer = stack_host.TransformerBlock()
    owners = [m for m in layer.modules() if list(m.parameters(recurse=False))]
    assert len(owners) == 6 and len(list(layer.parameters())) == 12
    x = torch.randn(stack_host.TOKENS, stack_host.HIDDEN, requires_grad=True)
    y = layer(x)
    y.sum().backward()
    assert y.shape == x.shape and x.grad is not None


def test_the_shard_grad_op_ratio_is_the_committed_measurement():
    import json
    import statistics
    from pathlib import Path

    from predictor.host import FSDP1_SHARD_GRAD_OP_HOOK_RATIO
    folder = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "fsdp1-host"
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("cpu-*.json"))]
    ratios = [r["fsdp1_zero2_over_fsdp1"] for r in runs if "fsdp1_zero2_over_fsdp1" in r]
    assert len(ratios) >= 3
    assert FSDP1_SHARD_GRAD_OP_HOOK_RATIO == pytest.approx(statistics.median(ratios), abs=5e-4)


# calibrate.stack_host's CHECKPOINT_WRAPPERS and CHECKPOINT_LAYERS, named here so that the cases
# are listed (and skipped one by one) without torch.
WRAPPERS = ("megatron", "deepspeed", "torch", "torch_op_sac", "torch_reentrant")
LAYERS = ("gpt", "block")


def test_the_cases_are_the_measured_wrappers_and_layers():
    stack_host = _stack_host()
    assert WRAPPERS == stack_host.CHECKPOINT_WRAPPERS and LAYERS == stack_host.CHECKPOINT_LAYERS


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_checkpoint_wrappers_compute_what_the_bare_layers_do(one_rank, wrapper, layer):
    """Each wrapper's layers give the unwrapped layers' output and input gradient (the same
    weights), so what the timing compares is the wrapper's own work, not other arithmetic."""
    import torch

    stack_host = _stack_host()
    if wrapper == "deepspeed":
        pytest.importorskip("deepspeed", reason="DeepSpeed's checkpoint is what is run (no dependency of perfcast)")
    torch.manual_seed(0)
    bare = stack_host._Wrapped(2, "none", layer=layer)
    x = torch.randn(stack_host.TOKENS, bare.width, requires_grad=True)
    want = bare(x)
    (want_grad,) = torch.autograd.grad(want.sum(), x)
    torch.manual_seed(0)
    model = stack_host._Wrapped(2, wrapper, layer=layer)
    for mine, theirs in zip(model.parameters(), bare.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    xw = x.detach().requires_grad_(True)
    out = model(xw)
    assert torch.allclose(out, want, atol=1e-6)
    out.sum().backward()
    assert torch.allclose(xw.grad, want_grad, atol=1e-6)


def test_the_op_sac_wrapper_recomputes_every_second_matmul_of_each_layer(one_rank):
    """TorchTitan's policy (calibrate.op_sac) around each GPT-shaped layer: of its four matmuls
    (QKV, projection, MLP up, MLP down) the projection and the MLP's down are run again in the
    backward, in every layer; the rest come from the checkpoint's cache."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import set_checkpoint_early_stop

    stack_host = _stack_host()

    class Addmms(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.widths: list[tuple[int, int]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            # The layers' linears have biases: their forward is addmm, the backward's matmuls mm.
            if func == torch.ops.aten.addmm.default:
                self.widths.append((args[1].shape[1], args[2].shape[1]))
            return func(*args, **(kwargs or {}))

    model = stack_host._Wrapped(2, "torch_op_sac", layer="gpt")
    h = model.width
    x = torch.randn(stack_host.TOKENS, h, requires_grad=True)
    forward = Addmms()
    # The whole forward reruns (no early stop), so what is not run again was saved.
    with forward, set_checkpoint_early_stop(False):
        out = model(x)
    assert len(forward.widths) == 8
    backward = Addmms()
    with backward:
        out.sum().backward()
    # (in, out) widths: the projection (h -> h) and the MLP's down (ffn -> h), once per layer.
    second, fourth = forward.widths[1], forward.widths[3]
    assert second[1] == fourth[1] == h and fourth[0] > h
    assert backward.widths == [second, fourth, second, fourth]     # each layer rerun in forward order


def test_deepspeed_is_imported_on_the_cpu_without_leaving_its_accelerator_variable(monkeypatch):
    import os

    stack_host = _stack_host()
    pytest.importorskip("deepspeed", reason="DeepSpeed's import is what is checked (no dependency of perfcast)")
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    deepspeed = stack_host._import_deepspeed()
    assert "DS_ACCELERATOR" not in os.environ
    assert deepspeed.accelerator.get_accelerator().device_name() == "cpu"


def test_checkpoint_costs_are_the_slopes_less_the_plain_layer_and_one_forward(one_rank):
    stack_host = _stack_host()
    r = stack_host.checkpoint_costs((1, 2), repeats=3, rounds=1, wrappers=("megatron", "torch", "torch_op_sac"),
                                    layer="block")
    slope = r["layer_seconds"]
    assert r["layer"] == "block"
    for w in ("megatron", "torch", "torch_op_sac"):
        assert r["checkpoint_layer_seconds"][w] == pytest.approx(slope[w] - slope["none"] - slope["forward"])
    assert set(r["per_config"]) == {f"{k}_{n}" for k in ("none", "forward", "megatron", "torch", "torch_op_sac")
                                    for n in (1, 2)}
    assert all(v > 0 for v in r["per_config"].values())
    with pytest.raises(ValueError, match="unknown checkpoint wrapper 'apex'"):
        stack_host._Wrapped(1, "apex")
