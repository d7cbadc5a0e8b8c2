"""The figures docs/modelling.md quotes, recomputed from what they describe: §7's constants (the
code's values, the shipped platforms' fitted links and recorded runs) and §6's errors (fresh
predictions of the shipped platforms' recorded runs)."""
from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest

from predictor import estimate, load_platform, memory
from predictor.operators import OPERATORS
from predictor.platform import FITTED_SCALE_RANGE, Overheads

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "modelling.md").read_text(encoding="utf-8")
TABLE = DOC[DOC.index("## 7. Constants and their sources"):]


def _row(name: str) -> str:
    rows = [line for line in TABLE.splitlines() if line.startswith(f"| {name} ") or line.startswith(f"| `{name}`")]
    assert len(rows) == 1, f"docs/modelling.md §7 has {len(rows)} rows for {name}"
    return rows[0]


def _script_constant(name: str) -> float:
    tree = ast.parse((ROOT / "scripts" / "build_platforms.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not in scripts/build_platforms.py")


def test_every_shipped_run_lies_inside_the_fitted_scale_range_and_the_table_quotes_them():
    lo, hi = FITTED_SCALE_RANGE
    row = _row("FITTED_SCALE_RANGE")
    assert f"{lo}–{hi}" in row
    for name in ("dgx-h100", "perlmutter-a100", "vista-gh200"):
        ratios = [r.ratio for r in load_platform(name).validation]
        assert ratios and lo < min(ratios) and max(ratios) < hi
        assert f"{min(ratios):.3f}–{max(ratios):.3f} ({name}, {len(ratios)}" in row


def test_the_link_efficiency_and_its_measured_neighbours():
    eff = _script_constant("NCCL_EFFICIENCY")
    row = _row("NCCL_EFFICIENCY")
    assert f"| {eff} of the link rate |" in row
    assert load_platform("dgx-a100").links.intra_gbps == pytest.approx(300.0 * eff)
    assert load_platform("dgx-h100").links.intra_gbps == pytest.approx(450.0 * eff)
    perlmutter = load_platform("perlmutter-a100").links.intra_gbps
    vista = load_platform("vista-gh200").links.nic_gbps
    assert f"fit {perlmutter:.1f} GB/s inside a node, {perlmutter / 300:.2f} of 300" in row
    assert f"{vista:.1f} of NDR's 50 GB/s, {vista / 50:.2f}" in row


def test_latencies_quoted_are_the_shipped_ones():
    for name in ("dgx-a100", "perlmutter-a100", "vista-gh200"):
        links = load_platform(name).links
        assert (links.intra_latency_us, links.inter_latency_us) == (5.0, 10.0)
    links = load_platform("dgx-h100").links
    assert (links.intra_latency_us, links.inter_latency_us) == (5.0, 8.0)


def test_extrapolation_errors_are_the_largest_per_bundle_figures():
    row = _row("EXTRAPOLATION_ERROR_ABOVE")
    above = [float(x) for x in re.findall(r"(0\.\d{3}) on ", row)]
    below = [float(x) for x in re.search(r"below it[^:]*: ([0-9., ]+)\.", row).group(1).replace(",", " ").split()]
    assert len(above) == 3 and len(below) == 3
    assert estimate.EXTRAPOLATION_ERROR_ABOVE == max(above)
    assert estimate.EXTRAPOLATION_ERROR_BELOW == max(below)
    assert f"| {estimate.EXTRAPOLATION_ERROR_ABOVE} / {estimate.EXTRAPOLATION_ERROR_BELOW} |" in row


def test_values_in_the_table_are_the_code_s():
    o = Overheads()
    assert f"| {o.startup_seconds:g} s |" in _row("Overheads.startup_seconds")
    assert f"| {o.checkpoint_gbps_per_node:g} GB/s per node |" in _row("Overheads.checkpoint_gbps_per_node")
    assert f"| {o.checkpoint_fixed_seconds:g} s per checkpoint |" in _row("Overheads.checkpoint_fixed_seconds")
    reserve = _row("RESERVE_FIXED_BYTES")
    assert f"| {memory.RESERVE_FIXED_BYTES / memory.GIB:g} GiB + {memory.RESERVE_FRACTION:.0%}" \
        .replace("%", " %") in reserve
    assert f"| {estimate.ANALYTIC_REL_ERROR} |" in _row("ANALYTIC_REL_ERROR")
    assert f"| {estimate.TRANSFER_REL_ERROR} |" in _row("TRANSFER_REL_ERROR")
    assert estimate.REDUCE_BUCKET_ENTRIES == 5 * 10 ** 8
    factors = {"GEMMs": ("linear1", "linear_final", "bmm", "baddbmm"), "flash attention": ("flash_atten",),
               "softmax / GeLU": ("softmax", "scaled_masked_softmax", "gelu"), "SwiGLU": ("swiglu",),
               "residual add": ("res_add",), "cross entropy": ("cross_entropy",),
               "layer / RMS norm": ("layernorm", "rmsnorm"), "embedding": ("embedding",)}
    for what, names in factors.items():
        row = _row(f"backward factor, {what}")
        for n in names:
            assert f"| {OPERATORS[n].bwd_factor:g}" in row, (what, n)


@pytest.mark.parametrize("platform, row, readme", [
    ("perlmutter-a100", "| Perlmutter, paper Table IV (5 runs) |", "Perlmutter MAPE {:.1f} %"),
    ("vista-gh200", "| Vista, paper Table IV (5 runs) |", "Vista {:.1f} % (under-predicted"),
    ("dgx-h100", "| H100 family (33 real steps, one GPU) |", "real training steps on one H100 (33 runs): {:.1f} %")])
def test_where_we_stand_quotes_what_the_shipped_platform_predicts(platform, row, readme):
    # docs/modelling.md §6's MAPEs, and README.md's, recomputed from fresh predictions of each
    # platform's recorded runs.
    from predictor import Predictor
    plat = load_platform(platform)
    runs = plat.validation
    preds = Predictor(plat).predict_many([r.job for r in runs])
    mape = 100 * sum(abs(p.iteration_seconds / r.measured_iteration_seconds - 1) for p, r in zip(preds, runs)) / len(runs)
    line = [x for x in DOC.splitlines() if x.startswith(row)]
    assert len(line) == 1 and len(runs) == int(re.search(r"\((\d+) (?:runs|real steps)", row).group(1))
    assert line[0].split("|")[3].strip().startswith(f"{mape:.1f} %"), (platform, round(mape, 2))
    assert readme.format(mape) in " ".join((ROOT / "README.md").read_text(encoding="utf-8").split()), \
        (platform, round(mape, 2))


def test_stack_constants_are_quoted_as_shipped():
    from predictor import attention
    from predictor.operators import BYTES_PER_ELEMENT
    from predictor.recipe import FSDP2_MASTER_BYTES, fsdp2_shard_copies
    from predictor.job import TrainingJob
    assert f"| {attention._LENT_FULL_FROM_SEQ}, {attention._FIGURE_FULL_TO_SEQ} |" in _row("_LENT_FULL_FROM_SEQ")
    assert f"| {FSDP2_MASTER_BYTES} |" in _row("FSDP2_MASTER_BYTES")
    one = TrainingJob.from_dict({"model": {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 128},
                                 "layout": {"zero_stage": 3}, "run": {"precision": "bf16", "framework": "torchtitan"}})
    c = fsdp2_shard_copies(one.layout, "torchtitan", "bf16", "fp32", BYTES_PER_ELEMENT)
    assert c.forward_bytes + c.backward_bytes == 38.0 and "38 counted" in _row("ShardCopies bytes (FSDP2)")
    for name in ("dgx-h100", "dgx-a100", "perlmutter-a100", "vista-gh200"):
        host = load_platform(name).host
        assert f"{1e3 * host.fsdp_layer_seconds:.2f} ms" in _row("fsdp_layer_seconds")
        assert f"{1e6 * host.collective_seconds:.1f} µs" in _row("collective_seconds")


def test_zero3_hooks_are_quoted_as_shipped():
    for name in ("dgx-h100", "dgx-a100", "perlmutter-a100", "vista-gh200"):
        assert f"{1e3 * load_platform(name).host.zero3_layer_seconds:.2f} ms" in _row("zero3_layer_seconds")


def test_engine_costs_are_quoted_as_shipped():
    row = _row("[host.engines]")
    for name in ("dgx-h100", "dgx-a100", "perlmutter-a100", "vista-gh200"):
        engines = load_platform(name).host.engines
        e = engines["deepspeed"]
        assert (f"`deepspeed`: {1e3 * e.step_seconds:.3f} ms per step, {1e3 * e.micro_batch_seconds:.3f} ms per "
                f"micro-batch, {1e3 * e.layer_seconds:.3f} ms per layer") in row, name
        p = engines["deepspeed_pipeline"]
        assert (f"`deepspeed_pipeline`: {1e3 * p.step_seconds:.2f}, {1e3 * p.micro_batch_seconds:.2f}, "
                f"{1e3 * p.layer_seconds:.3f} ms") in row, name


def test_the_fill_level_is_quoted_as_it_is():
    from statistics import NormalDist

    from slurm_plugin.policy import FILL_LEVEL
    z = NormalDist().inv_cdf
    assert f"| {FILL_LEVEL} (the 95 % upper end's log half-width × {z(FILL_LEVEL) / z(0.95):.3f})" in _row("FILL_LEVEL")


def test_checkpoint_wrapper_costs_are_quoted_as_shipped():
    from predictor import host
    for name in ("dgx-a100", "dgx-h100", "perlmutter-a100", "vista-gh200"):
        costs = load_platform(name).host.checkpoint_layer_seconds
        row = _row("checkpoint_layer_seconds")
        for wrapper, seconds in costs.items():
            assert f"{wrapper} {1e3 * seconds:.3g}" in row, (name, wrapper, seconds)
    assert f"| {host.FSDP1_SHARD_GRAD_OP_HOOK_RATIO} |" in _row("FSDP1_SHARD_GRAD_OP_HOOK_RATIO")
    assert f"| {host.FSDP1_ACCUMULATION_HOOK_RATIO} |" in _row("FSDP1_ACCUMULATION_HOOK_RATIO")


def test_megatrons_layer_extra_and_its_example_are_quoted_as_they_are(monkeypatch):
    from predictor import Predictor, TrainingJob, host
    assert f"| {1e6 * host.MEGATRON_LAYER_EXTRA_SECONDS:.0f} µs |" in _row("MEGATRON_LAYER_EXTRA_SECONDS")
    assert f"| {1e6 * host.MEGATRON_LAYER_FORWARD_EXTRA_SECONDS:.0f} µs |" in \
        _row("MEGATRON_LAYER_FORWARD_EXTRA_SECONDS")
    section = DOC[DOC.index("*Megatron's own layer*"):]
    section = " ".join(section[:section.index("\n\n")].split())
    assert f"**{1e6 * host.MEGATRON_LAYER_EXTRA_SECONDS:.0f} µs**" in section
    assert f"**{1e6 * host.MEGATRON_LAYER_FORWARD_EXTRA_SECONDS:.0f} µs**" in section

    def job(micro_batch: int) -> TrainingJob:
        return TrainingJob.from_dict({
            "model": {"layers": 24, "hidden": 1024, "heads": 16, "seq_len": 2048, "vocab": 50257,
                      "attention": "fused_softmax"},
            "layout": {"pp": 1, "tp": 8, "dp": 1, "micro_batch": micro_batch, "micro_batches": 8,
                       "zero_stage": 1, "recompute": "none"},
            "run": {"precision": "fp16", "framework": "megatron-deepspeed"}, "cluster": {"gpus_per_node": 8}})

    plat = load_platform("dgx-a100")
    now = Predictor(plat).predict(job(1)).iteration_seconds
    bound = Predictor(plat).predict(job(4)).iteration_seconds
    monkeypatch.setitem(host.DEEPSPEED_ZERO_HOOK_LAYER_SECONDS, 1, 0.0)
    layer_only = Predictor(plat).predict(job(1)).iteration_seconds
    monkeypatch.setattr(host, "MEGATRON_LAYER_EXTRA_SECONDS", 0.0)
    monkeypatch.setattr(host, "MEGATRON_LAYER_FORWARD_EXTRA_SECONDS", 0.0)
    before = Predictor(plat).predict(job(1)).iteration_seconds
    assert f"{before:.3f} → {layer_only:.3f} s ({now:.3f} s with ZeRO-1's hooks" in section
    assert f"stays device-bound ({bound:.3f} s)" in section
    assert Predictor(plat).predict(job(4)).iteration_seconds == bound


def test_deepspeeds_zero_hooks_and_zero2_example_are_quoted_as_they_are(monkeypatch):
    from predictor import Predictor, TrainingJob, estimate, host
    hooks = host.DEEPSPEED_ZERO_HOOK_LAYER_SECONDS
    row = _row("DEEPSPEED_ZERO_HOOK_LAYER_SECONDS")
    assert f"| ZeRO-1 {1e6 * hooks[1]:.1f} µs, ZeRO-2 {1e6 * hooks[2]:.1f} µs |" in row
    section = " ".join(DOC[DOC.index("*DeepSpeed's ZeRO-1/2 gradient hooks*"):].split())
    assert f"**{1e6 * hooks[1]:.1f} µs** at ZeRO-1" in section and f"**{1e6 * hooks[2]:.1f} µs** at ZeRO-2" in section

    def job(zero: int) -> TrainingJob:
        return TrainingJob.from_dict({
            "model": {"layers": 24, "hidden": 2048, "heads": 16, "seq_len": 2048, "vocab": 50257,
                      "attention": "fused_softmax"},
            "layout": {"pp": 1, "tp": 1, "dp": 16, "micro_batch": 4, "micro_batches": 8, "zero_stage": zero,
                       "recompute": "none"},
            "run": {"precision": "fp16", "framework": "deepspeed"}, "cluster": {"gpus_per_node": 8}})

    plat = load_platform("dgx-a100")
    two, one = (Predictor(plat).predict(job(z)).iteration_seconds for z in (2, 1))
    monkeypatch.setattr(estimate, "reduces_every_micro_batch", lambda *a, **k: False)
    monkeypatch.setitem(hooks, 2, 0.0)
    before = Predictor(plat).predict(job(2)).iteration_seconds
    text = " ".join(DOC[DOC.index("DeepSpeed's ZeRO-2 keeps only its"):].split())
    assert f"ZeRO-2 {before:.3f} → {two:.3f} s (ZeRO-1 {one:.3f} s)" in text


def test_framework_spec_and_measured_constants_are_quoted_as_they_are():
    from predictor import advise, attention, fp8, network, overlap, recipe, tp_overlap
    assert f"| {fp8.ACHIEVABLE_TENSOR_FRACTION} of the tensor cores' peak |" in _row("ACHIEVABLE_TENSOR_FRACTION")
    assert (overlap.BUCKET_MIN_ENTRIES, overlap.BUCKET_ENTRIES_PER_RANK) == (4 * 10 ** 7, 10 ** 6)
    assert "| max(4 × 10⁷, 10⁶ × dp) parameters per bucket |" in _row("BUCKET_MIN_ENTRIES")
    assert f"| {tp_overlap.PIPELINE_SPLITS} chunks; {tp_overlap.COMM_SMS} SMs" in _row("PIPELINE_SPLITS")
    (sms, margin), slowdown = next(iter(tp_overlap.MEASURED_MARGIN_SLOWDOWN.items()))
    assert f"| × {slowdown} with {margin} of {sms} SMs kept;" in _row("MEASURED_MARGIN_SLOWDOWN")
    sm_row = _row("SM_COUNTS")
    assert all(f"{tp_overlap.SM_COUNTS[g]} ({label})" in sm_row for g, label in (("h100 pcie", "H100 PCIe"),
                                                                                  ("a100", "A100")))
    assert f"{tp_overlap.DEFAULT_SMS} when the GPU is not named" in sm_row
    assert f"a multiple of {recipe.VOCAB_MULTIPLE} × tp" in _row("VOCAB_MULTIPLE")
    assert f"| {recipe.FIRST_STAGE_ITEMS}, {recipe.LAST_STAGE_ITEMS} |" in _row("FIRST_STAGE_ITEMS")
    lo, hi = attention._H100_FLASH2_NONCAUSAL_FWD[0], attention._H100_FLASH2_NONCAUSAL_FWD[-1]
    assert f"| {lo}–{hi} TFLOP/s" in _row("_H100_FLASH2_NONCAUSAL_FWD")
    assert f"| {attention._A100_CUDNN_SPEED_VS_FLASH2} |" in _row("_A100_CUDNN_SPEED_VS_FLASH2")
    assert network.SMALL_MESSAGE_BYTES == 4 << 20 and "| 4 MiB |" in _row("SMALL_MESSAGE_BYTES")
    assert f"| {advise.CP_MIN_TOKENS_PER_RANK:,} tokens |" in _row("CP_MIN_TOKENS_PER_RANK")
    row = _row("ELEMENT_BYTES")
    assert (memory.ELEMENT_BYTES, memory.OPTIMIZER_BYTES) == ({"fp16": 2, "bf16": 2, "fp32": 4},
                                                             {"fp16": 12, "bf16": 12, "fp32": 8})
    assert "optimizer 12 bytes per parameter with 16-bit training, 8 in fp32" in row


def test_the_install_verdict_is_quoted_as_it_is():
    from calibrate import install
    assert f"× {1 + install.DEFAULT_TOLERANCE:.2f} + {100 * install._ABS_SLACK:g} points" in _row("DEFAULT_TOLERANCE")
    assert f"| {install.DEFAULT_REFIT_MIN_RUNS} harvested runs |" in _row("DEFAULT_REFIT_MIN_RUNS")


def test_the_interval_and_fit_constants_quoted_are_the_code_s():
    from calibrate.fitting import identification, kinds
    from calibrate import validate
    from predictor import interval
    assert f"| {interval.ALPHA:.2f} (a 90 % interval) |" in _row("ALPHA")
    assert f"| {interval.MIN_OWN_RUNS} runs |" in _row("MIN_OWN_RUNS")
    prior = interval.SHIPPED_PRIOR
    assert (f"quantile {prior.quantile}, maximum {prior.maximum}, {prior.runs} runs"
            in _row("SHIPPED_PRIOR"))
    assert f"| {identification.NOISE_FLOOR} of log step time |" in _row("NOISE_FLOOR")
    assert f"| {identification.MIN_FIT_RUNS} runs |" in _row("MIN_FIT_RUNS")
    assert validate.MIN_FIT_RUNS == kinds.MIN_FIT_RUNS == identification.MIN_FIT_RUNS
    assert f"| {validate._Z} standard errors |" in _row("_Z")
    assert kinds.TAU0 == validate._TAU == pytest.approx(math.log(2) / 2)
    assert kinds.LAMBDAS[0] == pytest.approx(1e-5) and kinds.LAMBDAS[-2] == pytest.approx(1e3)
    assert len(kinds.LAMBDAS) == 18 and math.isinf(kinds.LAMBDAS[-1])
    assert f"| {kinds.SNAP} |" in _row("SNAP")
    assert kinds.SNAP == pytest.approx(identification.NOISE_FLOOR / 6)
