#!/usr/bin/env python3
"""Build the shipped platforms (predictor/platforms/) from the paper's measured samples.

    python scripts/build_platforms.py --data DIR [--only all|paper|h100|host-priors|convert]

DIR is the estimate-train-time data (its Perlmutter/ and Vista/ folders); not needed for --only h100.

perlmutter-a100 and vista-gh200 are calibrated (compute and collectives measured); dgx-a100 reuses
the A100 compute bundle on a DGX-A100 network from published specs.  The paper's measured
end-to-end runs (benchmarks/data/paper-runs-*.toml) are recorded on the two measured platforms.

dgx-h100's compute bundle and host costs are fitted from perfcast's own calibration of one H100
80GB HBM3 (benchmarks/data/h100-lent: ``perf-calibrate run`` operator samples, ``perf-calibrate
host`` host costs, and real training steps of a small GPT family recorded as its measured runs);
its network is from published specs.  ``--only h100`` rebuilds it alone (no --data needed).
The other platforms carry the same host costs as a prior (their CPUs were not measured), and
every platform carries DeepSpeed's engines' host costs (``[host.engines]``) measured on a CPU by
benchmarks/bench_engine_host.py (benchmarks/data/engine-host) as a prior; ``--only host-priors``
rewrites just those tables.

``--only convert`` refits nothing: it rewrites every shipped bundle still in an older bundle format
in the current one (the same trees, so every prediction stays the same to the bit) and re-pins the
platforms' manifests.  That is how the shipped bundles moved to the forest file (bundle format 2)
without a refit, which would have changed them with the libraries' versions.
"""
from __future__ import annotations

import argparse
import functools
import json
import logging
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from calibrate.engine_costs import engine_prior
from calibrate.fitting import BundleFitter, convert_bundle
from calibrate.fitting.host import platform_host_table
from calibrate.importers import import_estimate_train_time
from calibrate.shipped_gpus import A100, GH200, H100
from calibrate.stack_files import LENT_STACKS_DIR, OTHER_HOST_STEP_FILES
from calibrate.stack_host import (GPU_CHECKPOINT_WRAPPERS, gpu_checkpoint_layer_seconds, gpu_fsdp_layer_seconds,
                                  gpu_paired_checkpoint_layer_seconds)
from calibrate.validate import load_runs, validate_platform
from predictor.bundle import MANIFEST, load_bundle
from predictor.host import CHECKPOINT_WRAPPERS
from predictor.platform import PLATFORM_FILE, pin_platform_bundles, write_platform
from predictor.job import TrainingJob
from predictor.samples import load_samples
from predictor.validation import MeasuredRun

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "predictor" / "platforms"
RUNS = ROOT / "benchmarks" / "data"   # the paper's measured end-to-end runs, per platform

# The share of a link's rate NCCL's bus bandwidth reaches on large messages, for spec-only links.
# NCCL's own tuning model caps an A100's (sm80) bus bandwidth at 235 of NVLink3's 300 GB/s (0.78,
# src/graph/tuning.cc); the paper's Perlmutter all-reduces fit 0.75 of it, Vista's inter-node ones
# 0.97 of NDR's 50 GB/s (docs/modelling.md §7).
NCCL_EFFICIENCY = 0.8
# Per ring step, as predictor.network's ring model charges it: 5 µs inside a node, 10 µs (HDR) and
# 8 µs (NDR) between nodes.  NCCL's tuning model charges 3.4 µs per NVLink step and 9.6 µs per network
# step (ring, Simple protocol) plus 8.4 µs per call; the 8 µs for NDR has no source of its own.
DGX_A100_LINKS = {  # NVSwitch: 600 GB/s NVLink3 per GPU (both directions); 8 × HDR 200 Gb/s
    "intra_gbps": 300.0 * NCCL_EFFICIENCY, "intra_latency_us": 5.0,
    "nic_gbps": 25.0 * NCCL_EFFICIENCY, "nics_per_node": 8, "inter_latency_us": 10.0, "source": "spec"}
DGX_H100_LINKS = {  # NVSwitch: 900 GB/s NVLink4 per GPU; 8 × NDR 400 Gb/s
    "intra_gbps": 450.0 * NCCL_EFFICIENCY, "intra_latency_us": 5.0,
    "nic_gbps": 50.0 * NCCL_EFFICIENCY, "nics_per_node": 8, "inter_latency_us": 8.0, "source": "spec"}

H100_NOTICE = ("H100 compute bundle and host costs measured by perfcast (perf-calibrate run/host) on one "
               "lent NVIDIA H100 80GB HBM3, 2026-11-23; its FP8 linear GEMMs (run --precision fp8) and "
               "their host calls on a second lease, 2026-11-25; samples in benchmarks/data/h100-lent.")
NOTICE = ("Bundles built from the measured samples of Zhang et al. (arXiv:2509.22832), "
          "estimate-train-time, MIT licence (see LICENSE in each bundle).")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="", help="the estimate-train-time data directory (not for --only h100)")
    ap.add_argument("--only", choices=("all", "paper", "h100", "host-priors", "convert"), default="all")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if args.only in ("all", "h100"):
        build_h100()
    if args.only in ("all", "paper"):
        if not args.data:
            ap.error("--data DIR (the estimate-train-time data) is needed to build the paper's platforms")
        build_paper(Path(args.data))
    if args.only == "host-priors":
        apply_host_priors()
    if args.only == "convert":
        convert_shipped()
    shutil.rmtree(OUT / "__pycache__", ignore_errors=True)
    return 0


def build_h100() -> None:
    """dgx-h100 from the H100 samples in benchmarks/data/h100-lent (see the module docstring)."""
    src = RUNS / "h100-lent"
    samples = load_samples(src)
    rep = BundleFitter(name="h100-80gb-hbm3", gpu=H100, extra_meta={"notice": H100_NOTICE}).fit(
        samples, OUT / "_bundles" / "h100-80gb-hbm3", overwrite=True)
    print(f"== h100-80gb-hbm3 compute\n{rep.table()}")
    write_platform(OUT / "dgx-h100", {
        "name": "dgx-h100", "calibrated": True, "gpus_per_node": 8,
        "description": "DGX H100: 8 × H100-SXM5-80GB, NVSwitch, 8 × NDR 400 Gb/s; H100 compute and host "
                       "costs measured by perfcast on one H100 80GB HBM3, network from published specs",
        "compute_bundle": "../_bundles/h100-80gb-hbm3",
        "links": DGX_H100_LINKS,
        "host": with_stack_prior({**host_costs(src / "host.toml"),
                                  "engines": engine_prior(RUNS / "engine-host")}),
        "notes": [H100_NOTICE]})
    summary = validate_platform(OUT / "dgx-h100", family_runs(src / "train-family.json"), replace=True)
    print(f"== dgx-h100 end-to-end runs (one GPU)\n{summary.table()}")


def convert_shipped() -> None:
    """Every shipped bundle in the current bundle format (same trees), the platforms re-pinned."""
    bundles = sorted(p.parent for p in OUT.glob(f"*/*/{MANIFEST}")) + \
        sorted(p.parent for p in OUT.glob(f"*/{MANIFEST}"))
    for b in bundles:
        before = load_bundle(b).format
        convert_bundle(b)
        print(f"== {b.relative_to(OUT)}: bundle format {before} -> {load_bundle(b).format}")
    for plat in sorted(p.parent for p in OUT.glob(f"*/{PLATFORM_FILE}")):
        pins = pin_platform_bundles(plat)
        print(f"== {plat.name}: {', '.join(sorted(pins)) or 'pins unchanged'}")


def host_prior(path: Path) -> dict:
    """The H100 machine's host costs as a prior for a platform whose CPU was not measured.

    Only the per-layer, per-micro-batch and launch costs travel: the per-call costs
    (``[host.operators]``) describe how *those* samples were timed, not another bundle's.
    """
    table = host_costs(path)
    table.pop("operators")
    table["engines"] = engine_prior(RUNS / "engine-host")
    table["source"] = ("prior: " + table["source"].replace("; the lent machine's CPU, not a DGX's", "")
                       + "; this platform's own CPU was not measured (perf-calibrate host replaces it)")
    return with_stack_prior(table)


@functools.lru_cache(maxsize=None)
def stack_prior() -> tuple[dict, str]:
    """The per-collective host cost, DeepSpeed ZeRO-3's per-layer hooks and each activation-
    checkpointing wrapper's own per-layer work, all as the lent H100 node's host paid them: the
    medians of benchmarks/bench_stack_host.py --device cuda over ``stack-host/nccl-h100-*.json``,
    ``zero3-layer-transformer-partitioned-h100-*.json`` and ``checkpoint-h100-*.json`` (megatron,
    deepspeed), FSDP2's per-layer cost from the real FSDP2 and DDP steps
    (calibrate.stack_host.gpu_fsdp_layer_seconds), the wrappers measured in real steps
    (torch_op_sac, torch_fsdp, and torch from DDP's steps with and without full AC), and the source
    that says so; read once."""
    folder, gpu_steps = RUNS / "stack-host", RUNS / "h100-lent" / "stacks" / "stacks2.json"
    ckpt_steps = RUNS / "h100-lent" / "stacks" / "hseries.json"
    plain_ckpt_steps = [LENT_STACKS_DIR / name for name in OTHER_HOST_STEP_FILES]

    def committed(pattern: str) -> list[dict]:
        return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob(pattern))]
    # The TP collective as a GPU node's host issues it: c10d's NCCL path on the lent H100 (the
    # 2-core VM's gloo runs, cpu-*.json, are kept for reference).
    runs = committed("nccl-h100-*.json")
    # ZeRO-3's hooks as the lent H100 node's host runs them (--device cuda --deepspeed: the engine on
    # the GPU, one NCCL rank) around a transformer layer (6 modules, 12 parameters) with its weight
    # matrices partitioned, as a real layer's are (--zero3-layer transformer --zero3-persistence
    # 257).  The VM's gloo runs (deepspeed-zero3-*.json, zero3-layer-*-[0-9].json) and the GPU node's
    # runs around the tiny block (zero3-h100-*.json, zero3-layer-block-h100-*.json) are kept for
    # reference; the block's figure times the VM's layer/block ratio shipped until 2026-11-27.
    zero3_runs = committed("zero3-layer-transformer-partitioned-h100-*.json")
    block_runs = committed("zero3-layer-block-h100-*.json")
    collective = statistics.median(r["tp"]["collective_seconds"] for r in runs)
    zero3 = statistics.median(r["deepspeed_zero3"]["zero3_hook_layer_seconds"] for r in zero3_runs)
    zero3_block = statistics.median(r["deepspeed_zero3"]["zero3_hook_layer_seconds"] for r in block_runs)
    # Every wrapper as the lent H100 node's host runs it (the 2-core VM's checkpoint-N.json and
    # checkpoint-block-N.json are kept for reference).
    checkpoint: dict[str, float] = {}
    steps = json.loads(gpu_steps.read_text(encoding="utf-8"))
    fsdp = gpu_fsdp_layer_seconds(steps["rows"], H100.memory_gbps * 1e9)
    # TorchTitan's op-level SAC and full AC as a GPU node's host runs them around FSDP2 blocks:
    # FSDP2 with each against without, interleaved in one call.
    ckpt = json.loads(ckpt_steps.read_text(encoding="utf-8"))
    forward = host_costs(RUNS / "h100-lent" / "host.toml")["layer_forward_seconds"]
    gpu_ckpt = {w: gpu_checkpoint_layer_seconds(ckpt["rows"], r, forward)
                for r, w in GPU_CHECKPOINT_WRAPPERS.items()}
    for wrapper, measured in gpu_ckpt.items():
        checkpoint[wrapper] = round(measured[wrapper], 8)
    # PyTorch's plain wrapper (no FSDP) as the GPU node's host runs it: DDP with full AC against
    # without, paired within each round (the lease's host drifted too much for fastest slopes).
    plain_files = [json.loads(p.read_text(encoding="utf-8")) for p in plain_ckpt_steps]
    plain = gpu_paired_checkpoint_layer_seconds([f["rows"] for f in plain_files], "ddp", forward)
    checkpoint["torch"] = round(plain["seconds"], 8)
    # Megatron-core's reentrant wrapper (the stand-in) and DeepSpeed's as the lent H100 node's host
    # runs them around the GPT-shaped layer on the GPU (--device cuda --checkpoint); DeepSpeed was
    # installed there from the third run on.
    gpu_bench = committed("checkpoint-h100-*.json")
    gpu_runs = {w: [r["checkpoint"]["checkpoint_layer_seconds"][w] for r in gpu_bench
                    if w in r["checkpoint"]["checkpoint_layer_seconds"]] for w in ("megatron", "deepspeed")}
    for wrapper, measured in gpu_runs.items():
        # A difference of slopes: one below zero would be noise, shipped as none.
        checkpoint[wrapper] = round(max(0.0, statistics.median(measured)), 8)
    missing = set(CHECKPOINT_WRAPPERS) - set(checkpoint)
    if missing:
        raise SystemExit(f"build_platforms: no GPU node's figure for checkpoint wrapper(s) {sorted(missing)}")
    checkpoint = {w: checkpoint[w] for w in CHECKPOINT_WRAPPERS}
    gmeta = gpu_bench[0]["provenance"]
    ds_meta = next(r["provenance"] for r in gpu_bench if "deepspeed" in r["provenance"])
    depths = gpu_ckpt["torch_op_sac"]["depths"]
    meta, zmeta, gpu = runs[0]["provenance"], zero3_runs[0]["provenance"], steps["provenance"]
    values = {"collective_seconds": round(collective, 8), "fsdp_layer_seconds": round(fsdp["fsdp_layer_seconds"], 7),
              "zero3_layer_seconds": round(zero3, 7), "checkpoint_layer_seconds": checkpoint}
    note = (f"; collective_seconds: prior from benchmarks/bench_stack_host.py --device cuda (median of "
            f"{len(runs)} runs, one NCCL rank on the lent {meta['gpu']}, torch {meta['torch']}, NCCL "
            f"{meta['nccl']}, {meta['date'][:16]}); fsdp_layer_seconds: FSDP2 less DDP per "
            f"layer and micro-batch, less FSDP2's copies, on the lent {gpu['gpu']} (torch {gpu['torch']}, "
            f"{gpu['date'][:10]}, depths {'/'.join(map(str, fsdp['depths']))}: benchmarks/data/h100-lent/stacks); "
            f"zero3_layer_seconds: DeepSpeed {zmeta['deepspeed'].strip()} ZeRO-3 less stage 0 per layer and "
            f"micro-batch around a transformer layer, its weights partitioned (--zero3-persistence "
            f"{zero3_runs[0]['deepspeed_zero3']['persistence_threshold']}), benchmarks/bench_stack_host.py "
            f"--device cuda --deepspeed --zero3-layer transformer (median of {len(zero3_runs)} runs, one NCCL rank "
            f"on the lent {zmeta['gpu']}, torch {zmeta['torch']}, {zmeta['date'][:16]}: benchmarks/data/"
            f"stack-host/zero3-layer-transformer-partitioned-h100-*.json; around the tiny block there, "
            f"{1e3 * zero3_block:.2f} ms: zero3-layer-block-h100-*.json); "
            f"checkpoint_layer_seconds: each wrapper's own work per layer and micro-batch, all on the lent "
            f"H100 node: torch_op_sac and torch_fsdp: FSDP2 with op-level SAC and with full AC less FSDP2, interleaved "
            f"({ckpt['provenance']['date'][:16]}), per layer and micro-batch, less one forward's issue, on the "
            f"lent {ckpt['provenance']['gpu']} (torch {ckpt['provenance']['torch']}, depths "
            f"{'/'.join(map(str, depths))}: benchmarks/data/h100-lent/stacks/hseries.json), and torch: DDP with "
            f"full AC less DDP, the median of {plain['pairs']} same-round pairs per layer and micro-batch, less one "
            f"forward's issue, on the lent {plain_files[0]['provenance']['gpu']} "
            f"({plain_files[0]['provenance']['date'][:16]}: benchmarks/data/h100-lent/stacks/rngseries*.json), "
            f"and megatron and deepspeed: benchmarks/bench_stack_host.py --device cuda --checkpoint on the lent "
            f"{gmeta['gpu']} (medians of {len(gpu_runs['megatron'])} and {len(gpu_runs['deepspeed'])} runs, torch "
            f"{gmeta['torch']}, deepspeed {ds_meta['deepspeed'].strip()}, {gmeta['date'][:16]} to "
            f"{gpu_bench[-1]['provenance']['date'][:16]}: benchmarks/data/stack-host/checkpoint-h100-*.json)")
    return values, note


def with_stack_prior(table: dict) -> dict:
    """``table`` with :func:`stack_prior`'s figures and its source said."""
    values, note = stack_prior()
    out = {k: v for k, v in table.items() if k not in values}
    out.update(values)
    out["source"] = out.get("source", "").split("; collective_seconds")[0] + note
    return out


def apply_host_priors() -> None:
    """Write the host prior into the platforms built from the paper's samples (and dgx-a100), and
    the engines' and the per-collective / per-FSDP-layer / per-checkpoint-wrapper priors into every
    shipped platform's [host] (dgx-h100 keeps its measured costs)."""
    prior = host_prior(RUNS / "h100-lent" / "host.toml")
    for plat in ("perlmutter-a100", "vista-gh200", "dgx-a100", "dgx-h100"):
        path = OUT / plat / "platform.toml"
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
        if plat == "dgx-h100":
            raw["host"]["engines"] = prior["engines"]
            raw["host"] = with_stack_prior(raw["host"])
        else:
            raw["host"] = prior
        write_platform(OUT / plat, raw)
        print(f"== {plat}: host prior written")


def host_costs(path: Path) -> dict:
    """The platform's [host] table from ``perf-calibrate host`` output (calibrate.fitting.host),
    said to be the lent machine's CPU."""
    table = platform_host_table(path)
    table["source"] += "; the lent machine's CPU, not a DGX's"
    return table


def family_runs(path: Path) -> list[MeasuredRun]:
    """Real training steps measured by benchmarks/bench_train_family.py, as measured runs."""
    return [MeasuredRun(name=d["name"], job=TrainingJob.from_dict(d["job"]),
                        measured_iteration_seconds=float(d["measured_iteration_seconds"]),
                        source=f"perfcast GPT step on one {d.get('gpu', 'GPU')} "
                               "(benchmarks/bench_train_family.py)")
            for d in json.loads(path.read_text(encoding="utf-8"))]


def build_paper(data: Path) -> None:
    prior = host_prior(RUNS / "h100-lent" / "host.toml")
    lic = data / "LICENSE"
    bundles = OUT / "_bundles"
    with tempfile.TemporaryDirectory() as tmp:
        for system, gpu, bundle_name, plat, gpn, nics, desc in (
            ("Perlmutter", A100, "a100-sxm4-80gb", "perlmutter-a100", 4, 4,
             "NERSC Perlmutter GPU nodes: 4 × A100-SXM4-80GB (NVLink3), Slingshot-11; measured"),
            ("Vista", GH200, "gh200-120gb", "vista-gh200", 1, 1,
             "TACC Vista: 1 × GH200 per node, NDR InfiniBand; measured"),
        ):
            samples_dir = Path(tmp) / system
            import_estimate_train_time(data / system, samples_dir)
            samples = load_samples(samples_dir)
            rep = BundleFitter(name=bundle_name, gpu=gpu, license_file=lic,
                               extra_meta={"notice": NOTICE}).fit(samples, bundles / bundle_name, overwrite=True)
            print(f"== {bundle_name} compute\n{rep.table()}")
            rep = BundleFitter(name=f"{plat}-collectives", gpu=gpu, kind="collectives", nics_per_node=nics,
                               license_file=lic, extra_meta={"notice": NOTICE}).fit(
                samples, OUT / plat / "collectives", overwrite=True)
            print(f"== {plat} collectives (links {rep.links})\n{rep.table()}")
            write_platform(OUT / plat, {
                "name": plat, "description": desc, "calibrated": True, "gpus_per_node": gpn,
                "compute_bundle": f"../_bundles/{bundle_name}", "collective_bundle": "collectives",
                "host": prior, "notes": [NOTICE]})
    write_platform(OUT / "dgx-a100", {
        "name": "dgx-a100", "calibrated": True, "gpus_per_node": 8,
        "description": "DGX A100: 8 × A100-SXM4-80GB, NVSwitch, 8 × HDR 200 Gb/s; A100 compute measured "
                       "on Perlmutter, network from published specs",
        "compute_bundle": "../_bundles/a100-sxm4-80gb", "links": DGX_A100_LINKS, "host": prior,
        "notes": [NOTICE]})
    for plat in ("perlmutter-a100", "vista-gh200"):
        summary = validate_platform(OUT / plat, load_runs(RUNS / f"paper-runs-{plat}.toml"), replace=True)
        print(f"== {plat} end-to-end runs\n{summary.table()}")


if __name__ == "__main__":
    sys.exit(main())
