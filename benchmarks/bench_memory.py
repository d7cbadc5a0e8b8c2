"""The memory model against published configurations, and its cost per layout.

    python benchmarks/bench_memory.py
    python benchmarks/bench_memory.py --measured [STACKS_JSON]

Hand-derived figures come straight from the papers' formulas (see predictor/memory.py):
ZeRO (Rajbhandari et al. 2020) model states for a 7.5 B model on 64 GPUs, Korthikanti et al.
(2022) first-stage activations of GPT-3 175B, 530B and 1T at their Table 3 layouts, and the
GPT-NeoX-20B parameter count (Black et al. 2022).  Then the per-GPU breakdown of the GPT-20B
layouts of Zhang et al. (2025) on an 80 GiB A100, and the time one estimate takes.

``--measured`` compares the peaks of real training steps (``torch.cuda.max_memory_allocated``,
default: the lent H100's benchmarks/data/h100-lent/stacks/stacks.json) with the model
(calibrate.memory_peaks), per stack, on the rows whose peak holds only their own job
(:func:`clean_rows`), and shows what the others carry.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from calibrate.memory_peaks import MEMORY_STACKS, PeakComparison, compare_peaks, summarize
from predictor import memory as mem
from predictor.job import Layout, ModelSpec

STACKS_JSON = Path(__file__).resolve().parent / "data" / "h100-lent" / "stacks" / "stacks.json"

GB = 1e9


def row(config: str, what: str, paper: float, model: float, unit: str = "GB") -> None:
    err = (model - paper) / paper * 100 if paper else 0.0
    print(f"  {config:28} {what:48} {paper:12.3f} {model:12.3f} {unit:3} {err:+7.3f}%")


def main() -> None:
    print("published configurations: paper formula (hand-derived) vs. predictor.memory")
    print(f"  {'configuration':28} {'quantity':48} {'paper':>12} {'model':>12}     {'diff':>7}")
    for stage, paper in ((0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)):
        row("ZeRO 7.5B, Nd=64", f"model states, ZeRO-{stage}", paper,
            mem.model_states_bytes(7.5e9, 64, stage) / GB)

    neox = ModelSpec(layers=44, hidden=6144, heads=64, seq_len=2048, vocab=50432,
                     tied_embeddings=False, parallel_residual=True)
    row("GPT-NeoX-20B", "parameters (billions)", 20.55456768,
        mem.stage_parameters(neox, Layout(), 0) / 1e9, "B")

    configs = [
        ("GPT-3 175B t8 p8 b1", ModelSpec(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200), 8),
        ("MT-NLG 530B t8 p35 b1", ModelSpec(layers=105, hidden=20480, heads=128, seq_len=2048, vocab=51200), 35),
        ("1T t8 p64 b1", ModelSpec(layers=128, hidden=25600, heads=160, seq_len=2048, vocab=51200), 64),
    ]
    for name, m, p in configs:
        sbh = m.seq_len * m.hidden
        a, s, h, t, L = m.heads, m.seq_len, m.hidden, 8, m.layers
        cases = [
            ("TP, no recompute", "none", False, sbh * L * (10 + 24 / t + 5 * a * s / (h * t)) + sbh * p),
            ("TP+SP, no recompute", "none", True, sbh * L / t * (34 + 5 * a * s / h) + sbh * p / t),
            ("TP+SP, selective", "selective", True, sbh * L * 34 / t + sbh * p / t),
            ("TP, full (+1 rebuilt layer)", "full", False,
             2 * sbh * L + sbh * (10 + 24 / t + 5 * a * s / (h * t)) + sbh * p),
        ]
        for label, rc, sp, paper in cases:
            lay = Layout(pp=p, tp=t, dp=1, micro_batch=1, micro_batches=p, recompute=rc,
                         sequence_parallel=sp, zero_stage=0)
            row(name, f"stage-0 activations, {label}", paper / GB,
                mem.stage_activation_bytes(m, lay, "fp16", 0) / GB)

    print("\nGPT-20B (Zhang et al. 2025) on 128 A100-80GB, fp16, ZeRO-1, micro-batch 4: GiB per GPU")
    m20 = ModelSpec(layers=44, hidden=6144, heads=64, seq_len=2048, parallel_residual=True)
    print(f"  {'PP-MP-DP':9} {'recompute':10} {'weights':>8} {'grads':>8} {'optim':>8} {'activ':>8} "
          f"{'reserve':>8} {'total':>8}  fits")
    for pp, tp, dp in ((4, 4, 8), (4, 8, 4), (8, 4, 4), (2, 4, 16), (1, 4, 32)):
        for rc in ("full", "selective", "none"):
            lay = Layout(pp=pp, tp=tp, dp=dp, micro_batch=4, micro_batches=512 // (4 * dp),
                         recompute=rc, zero_stage=1)
            e = mem.estimate(m20, lay, "fp16")
            g = mem.GIB
            print(f"  {pp}-{tp}-{dp:<5} {rc:10} {e.weights / g:8.2f} {e.gradients / g:8.2f} "
                  f"{e.optimizer / g:8.2f} {e.activations / g:8.2f} {e.reserve / g:8.2f} "
                  f"{e.total_gib:8.2f}  {'yes' if e.fits(80) else 'no'}")

    # Interleaved: 44 layers over pp 4 x 11 virtual stages (the chunks must divide the layers).
    lay = Layout(pp=4, tp=4, dp=8, micro_batch=2, micro_batches=16, recompute="selective",
                 virtual_stages=11, zero_stage=1)
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        mem.estimate(m20, lay, "fp16")
    dt = (time.perf_counter() - t0) / n
    print(f"\none estimate: {dt * 1e6:.1f} µs; 2,600 layouts (a 1024-GPU search) "
          f"≈ {2600 * dt * 1e3:.0f} ms")


# Stacks whose job is built and dropped inside one function call (calibrate.gpt_model's loop):
# nothing of a job outlives it, so each row's peak is its own.
FREEING_STACKS = ("pytorch", "sdpa_efficient")


def clean_rows(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(rows whose peak is their own job's, module-stack rows after the first of their stack).

    The module stacks (calibrate/stacks.py) leave each job's optimizer in a reference cycle
    until Python's collector runs, so in files written before bench_gpu_stacks.py collected it
    and recorded ``start_allocated_bytes`` (what earlier jobs left, which calibrate.memory_peaks
    takes off the peak) only the first job of such a stack starts on an empty GPU.
    """
    clean, later = [], []
    seen: set[str] = set()
    for row in rows:
        if "peak_allocated_bytes" not in row:
            continue
        stack = row.get("stack", "")
        if stack in FREEING_STACKS or stack not in seen or "start_allocated_bytes" in row:
            clean.append(row)
        else:
            later.append(row)
        if stack not in FREEING_STACKS:
            seen.add(stack)
    return clean, later


def print_comparisons(comps: list[PeakComparison]) -> None:
    g = mem.GIB
    print(f"  {'stack':14} {'job':38} {'measured':>8} {'weights':>7} {'grads':>6} {'optim':>6} "
          f"{'activ':>6} {'step':>6} {'model':>7} {'error':>7} {'+reserve':>8}  covered")
    for c in comps:
        e = c.estimate
        print(f"  {c.stack:14} {c.name:38} {c.measured_bytes / g:8.2f} {e.weights / g:7.2f} "
              f"{e.gradients / g:6.2f} {e.optimizer / g:6.2f} {e.activations / g:6.2f} "
              f"{e.optimizer_step / g:6.2f} {c.predicted_bytes / g:7.2f} {100 * c.error:+6.1f}% "
              f"{e.total / g:8.2f}  {'yes' if c.covered else 'NO'}")


def measured(path: Path) -> None:
    data = json.loads(path.read_text())
    prov = data.get("provenance", {})
    print(f"measured peaks ({path.name}: {prov.get('gpu', '?')}, torch {prov.get('torch', '?')}, "
          f"{prov.get('date', '?')}) against predictor.memory, GiB")
    print("  model = weights + grads + optim + max(activ, step) (the formulas, no reserve); "
          "error = (model - measured) / measured; covered = model + reserve >= measured")
    clean, later = clean_rows(data["rows"])
    undescribed = sorted({str(r.get("stack")) for r in clean if r.get("stack") not in MEMORY_STACKS})
    if undescribed:
        # e.g. the one-rank DDP module over bf16 parameters: no memory description to compare with
        print(f"  left out: the rows of {', '.join(undescribed)} (no memory description: "
              f"known {', '.join(MEMORY_STACKS)})")
        clean = [r for r in clean if r.get("stack") in MEMORY_STACKS]
    comps = compare_peaks(clean)
    print_comparisons(comps)
    print("\nper stack (rows whose peak is their own job's)")
    print(f"  {'stack':14} {'rows':>4} {'mean |err|':>10} {'max |err|':>9} {'bias':>7} {'covered':>8}")
    for s in summarize(comps):
        print(f"  {s.stack:14} {s.rows:4} {100 * s.mean_abs_error:9.1f}% {100 * s.max_abs_error:8.1f}% "
              f"{100 * s.bias:+6.1f}% {s.covered:4}/{s.rows}")
    flat = [c for c in comps if c.stack in FREEING_STACKS]
    if flat:
        # calibrate.gpt_model's MasterAdam allocates its fp32 master gradient once and keeps it
        # through the backward; the model holds that copy only at the step, instead of the
        # activations: the smaller of the two is what the flat loop holds beyond the model.
        rest = [(c.measured_bytes - c.predicted_bytes - min(c.estimate.activations, c.estimate.optimizer_step))
                / c.measured_bytes for c in flat]
        print("\nthe flat loop less its persistent fp32 gradient (min(activ, step) per row): "
              f"mean {100 * sum(rest) / len(rest):+.1f}%, range {100 * min(rest):+.1f}% .. {100 * max(rest):+.1f}%")
    if later:
        print("\nmodule-stack rows left out: measured - model against the optimizer states (8 bytes a "
              "parameter) of the same stack's earlier jobs, GiB")
        earlier: dict[str, float] = {}
        for row in data["rows"]:
            if "peak_allocated_bytes" not in row or row.get("stack") in FREEING_STACKS:
                continue
            stack = row["stack"]
            if row in later:
                c = compare_peaks([row])[0]
                print(f"  {stack:14} {row['name']:38} excess {(c.measured_bytes - c.predicted_bytes) / mem.GIB:6.2f}"
                      f"  earlier jobs' states {earlier.get(stack, 0.0) / mem.GIB:6.2f}")
            earlier[stack] = earlier.get(stack, 0.0) + 8.0 * row["params"]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", nargs="?", const=STACKS_JSON, type=Path, default=None, metavar="STACKS_JSON",
                    help="compare measured peaks instead (default file: %(const)s)")
    args = ap.parse_args()
    if args.measured is None:
        main()
    else:
        measured(args.measured)
