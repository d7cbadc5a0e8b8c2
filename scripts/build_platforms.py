#!/usr/bin/env python3
"""Build the shipped platforms (predictor/platforms/) from the paper's measured samples.

    python scripts/build_platforms.py [--data ../shared/data/estimate-train-time]

perlmutter-a100 and vista-gh200 are calibrated (compute and collectives measured); dgx-a100 reuses
the A100 compute bundle on a DGX-A100 network from published specs; dgx-h100 is from published specs
only (A100 efficiencies moved onto H100 peaks) and marked uncalibrated.  The paper's measured
end-to-end runs (benchmarks/data/paper-runs-*.toml) are recorded on the two measured platforms.
"""
from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from calibrate.importers import import_estimate_train_time  # noqa: E402
from calibrate.validate import load_runs, validate_platform  # noqa: E402
from predictor.bundle import fit_bundle  # noqa: E402
from predictor.operators import GpuSpec  # noqa: E402
from predictor.platform import write_platform  # noqa: E402
from predictor.samples import load_samples  # noqa: E402

OUT = ROOT / "predictor" / "platforms"
RUNS = ROOT / "benchmarks" / "data"   # the paper's measured end-to-end runs, per platform

# Published peaks (dense tensor-core TFLOP/s, HBM GB/s): the roofline normaliser only.
A100 = GpuSpec("NVIDIA A100-SXM4-80GB", 80.0, {"fp16": 312.0, "bf16": 312.0, "fp32": 156.0}, 2039.0)
GH200 = GpuSpec("NVIDIA GH200 120GB", 96.0, {"fp16": 989.0, "bf16": 989.0, "fp32": 494.0}, 4000.0)
H100 = GpuSpec("NVIDIA H100-SXM5-80GB", 80.0, {"fp16": 989.0, "bf16": 989.0, "fp32": 494.0}, 3350.0)

# NCCL reaches about 80 % of a link's signalling rate on large messages; spec-only links use that.
NCCL_EFFICIENCY = 0.8
DGX_A100_LINKS = {  # NVSwitch: 600 GB/s NVLink3 per GPU (both directions); 8 × HDR 200 Gb/s
    "intra_gbps": 300.0 * NCCL_EFFICIENCY, "intra_latency_us": 5.0,
    "nic_gbps": 25.0 * NCCL_EFFICIENCY, "nics_per_node": 8, "inter_latency_us": 10.0, "source": "spec"}
DGX_H100_LINKS = {  # NVSwitch: 900 GB/s NVLink4 per GPU; 8 × NDR 400 Gb/s
    "intra_gbps": 450.0 * NCCL_EFFICIENCY, "intra_latency_us": 5.0,
    "nic_gbps": 50.0 * NCCL_EFFICIENCY, "nics_per_node": 8, "inter_latency_us": 8.0, "source": "spec"}

NOTICE = ("Bundles built from the measured samples of Zhang et al. (arXiv:2509.22832), "
          "estimate-train-time, MIT licence (see LICENSE in each bundle).")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "estimate-train-time"))
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    data = Path(args.data)
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
            rep = fit_bundle(samples, bundles / bundle_name, name=bundle_name, gpu=gpu, license_file=lic,
                             extra_meta={"notice": NOTICE}, overwrite=True)
            print(f"== {bundle_name} compute\n{rep.table()}")
            rep = fit_bundle(samples, OUT / plat / "collectives", name=f"{plat}-collectives", gpu=gpu,
                             kind="collectives", nics_per_node=nics, license_file=lic,
                             extra_meta={"notice": NOTICE}, overwrite=True)
            print(f"== {plat} collectives (links {rep.links})\n{rep.table()}")
            write_platform(OUT / plat, {
                "name": plat, "description": desc, "calibrated": True, "gpus_per_node": gpn,
                "compute_bundle": f"../_bundles/{bundle_name}", "collective_bundle": "collectives",
                "notes": [NOTICE]})
    write_platform(OUT / "dgx-a100", {
        "name": "dgx-a100", "calibrated": True, "gpus_per_node": 8,
        "description": "DGX A100: 8 × A100-SXM4-80GB, NVSwitch, 8 × HDR 200 Gb/s; A100 compute measured "
                       "on Perlmutter, network from published specs",
        "compute_bundle": "../_bundles/a100-sxm4-80gb", "links": DGX_A100_LINKS, "notes": [NOTICE]})
    write_platform(OUT / "dgx-h100", {
        "name": "dgx-h100", "calibrated": False, "gpus_per_node": 8,
        "description": "DGX H100: 8 × H100-SXM5-80GB, NVSwitch, 8 × NDR 400 Gb/s; published specs only "
                       "(A100 efficiencies on H100 peaks), uncalibrated",
        "compute_bundle": "../_bundles/a100-sxm4-80gb",
        "gpu": {"name": H100.name, "memory_gib": H100.memory_gib, "memory_gbps": H100.memory_gbps,
                "tflops": dict(H100.tflops)},
        "links": DGX_H100_LINKS, "notes": [NOTICE]})
    for plat in ("perlmutter-a100", "vista-gh200"):
        summary = validate_platform(OUT / plat, load_runs(RUNS / f"paper-runs-{plat}.toml"), replace=True)
        print(f"== {plat} end-to-end runs\n{summary.table()}")
    shutil.rmtree(OUT / "__pycache__", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
