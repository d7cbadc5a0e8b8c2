"""perf-predict: how long will this training job take on that platform?

    perf-predict JOB [--platform NAME | --partition NAME] [--json]   JOB = TOML job file or batch script
    (a batch script's own #SBATCH --partition picks the platform through the site config, as at sbatch)
    perf-predict --list-platforms
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, Optional, Sequence

from predictor import PerfcastError
from predictor.errors import OneLineParser, error_document, wants_json

from .jobinput import UsageError, load_job_and_platform
from .policy import plural, slurm_duration

PROG = "perf-predict"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description="Predict the run time of a distributed LLM training job.")
    p.add_argument("job", nargs="?", help="TOML job file (.toml) or batch script")
    where = p.add_mutually_exclusive_group()   # (two answers to one question: as perf-advise)
    where.add_argument("--platform", help="shipped or installed platform name, or a platform directory")
    where.add_argument("--partition", help="Slurm partition (platform from the site config)")
    p.add_argument("--config", help="site config (default: $PERFCAST_CONFIG, else /etc/perfcast/perfcast.toml)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--list-platforms", action="store_true", help="list the platforms and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="log what is loaded")
    return p


def render(pred: Any, parsed: Any = None, gpu_memory_gib: float = 0.0) -> str:
    job = pred.job
    lay, m = job.layout, job.model
    lo, hi = pred.interval_seconds
    stages = pred.stages(gpu_memory_gib)
    peak = max(stages, key=lambda r: r["peak_memory_bytes"])
    gib = peak["peak_memory_bytes"] / 2**30
    where = f" (stage {peak['stage']} of {len(stages)})" if len(stages) > 1 else ""
    if not gpu_memory_gib:
        memory = f"memory    {gib:.1f} GiB per GPU at peak{where}"
    elif peak.get("fits", True):
        memory = f"memory    {gib:.1f} GiB per GPU at peak{where}, of {gpu_memory_gib:g} GiB"
    else:
        memory = (f"memory    {gib:.1f} GiB per GPU at peak{where}: DOES NOT FIT in {gpu_memory_gib:g} GiB "
                  f"(perf-advise lists layouts that do)")
    cp = f"-{lay.cp}" if lay.cp > 1 else ""
    lines = [
        f"job       {job.source or '-'}",
        f"model     {m.layers} layers, hidden {m.hidden}, {m.heads} heads, seq {m.seq_len}, "
        f"{m.norm}/{m.activation}/{m.attention}, {job.run.precision}; {pred.parameters / 1e9:.2f} B parameters",
        f"layout    PP-TP-DP{'-CP' if cp else ''} {lay.pp}-{lay.tp}-{lay.dp}{cp} on {plural(job.gpus, 'GPU')} "
        f"({plural(pred.details.nodes, 'node')}), micro-batch {lay.micro_batch} × {lay.micro_batches}, "
        f"ZeRO-{lay.zero_stage}, recompute {lay.recompute}"
        + (f", {lay.virtual_stages} virtual stages" if lay.virtual_stages > 1 else ""),
        f"platform  {pred.platform}  (bundle {pred.bundle})",
        memory,
        "",
        f"{'per iteration':<26}{'seconds':>10}",
    ]
    # The labels are the JSON keys' words (predictor.results.Breakdown.LABELS): one vocabulary.
    b = pred.breakdown
    for name in b.PARTS:
        v = getattr(b, name)
        if v or name != "step_overhead_seconds":
            lines.append(f"  {b.LABELS[name]:<24}{v:>10.3f}")
    for name in b.INSIDE:
        v = getattr(b, name)
        if v or name in ("tp_allreduce_seconds", "pp_p2p_seconds"):
            lines.append(f"  {'(of which ' + b.LABELS[name] + ')':<24}{v:>10.3f}")
    lines.append(f"{'iteration':<26}{pred.iteration_seconds:>10.3f}   [{lo:.3f} – {hi:.3f}]")
    d = pred.details
    if d is not None:
        r_lo, r_hi = d.timeline_ratio
        n = d.timeline_runs
        source = (d.interval_rule or {}).get("source", "")
        k = int((d.interval_rule or {}).get("runs", 0))
        whence = {"own": f"residuals of {n} runs measured here",
                  "pooled": f"residuals of {n} runs here and of the shipped platforms'",
                  "bundle": "no run measured here: runs of its compute bundle on "
                            f"{(d.interval_rule or {}).get('evidence', 'another platform')}",
                  "prior": "no run measured here: the shipped platforms' largest residual",
                  "kind": f"residuals of the {k} runs of this job's kind measured here",
                  "kind-pooled": f"this platform's rule widened by the {plural(k, 'run')} of this job's kind",
                  "unseen-kind": "no run of this job's kind here: no narrower than the spread across kinds",
                  }.get(source, f"{n} measured runs")
        widened = "; widened by operator spread" if (pred.extrapolated or d.analytic_collectives) else ""
        lines.append(f"{'':<26}(90 % interval × {r_lo:.2f}–{r_hi:.2f}: {whence}{widened})")
    lines.append("")
    if pred.iterations and d is not None:
        t = d.total
        lines.append(f"total     {slurm_duration(pred.total_seconds)}  ({plural(pred.iterations, 'iteration')}; "
                     f"start-up {t.startup_seconds:.0f} s, {plural(t.evaluations, 'evaluation')} "
                     f"{t.eval_seconds:.0f} s, {plural(t.checkpoints, 'checkpoint')} {t.checkpoint_seconds:.0f} s)")
    else:
        lines.append("total     unknown: the job gives no number of iterations")
    for w in pred.warnings:
        lines.append(f"warning   {w}")
    if parsed is not None:
        for w in getattr(parsed, "warnings", []) or []:
            lines.append(f"warning   {w}")
        unresolved = getattr(parsed, "unresolved", []) or []
        if unresolved:
            lines.append(f"unresolved {', '.join(unresolved)} (defaults used)")
    return "\n".join(lines)


def run(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format=f"{PROG}: %(message)s")
    from predictor import list_platforms, predict

    if args.list_platforms:
        plats = list_platforms()
        if args.json:
            print(json.dumps(plats, indent=2))
        else:
            for p in plats:
                tag = "" if p["calibrated"] else "  [uncalibrated]"
                print(f"{p['name']:<18} {p['gpus_per_node']} GPUs/node  {p['description']}{tag}")
        return 0
    if not args.job:
        raise UsageError("give a JOB (TOML job file or batch script), or --list-platforms")
    inp, plat = load_job_and_platform(args.job, args.platform, args.partition, args.config)
    if inp.platform_from:
        print(f"{PROG}: {inp.platform_from}", file=sys.stderr)
    pred = predict(inp.job, plat)
    if args.json:
        out = pred.to_dict(plat.gpu_memory_gib)
        if inp.parsed is not None:
            # The batch script's reading (Slurm request, provenance, unresolved keys) goes with
            # the job it produced; the job's own sections keep the keys of docs/job-file.md.
            script = inp.parsed.to_dict()
            script.pop("job", None)
            script.pop("job_dict", None)
            out["job"]["script"] = script
            # One list of everything the text output warns about: a consumer reading `warnings`
            # must see a typo in the launch as the text's reader does.
            out["warnings"] = list(out.get("warnings") or []) + list(inp.parsed.warnings or [])
        print(json.dumps(out, indent=2))
    else:
        print(render(pred, inp.parsed, plat.gpu_memory_gib))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        return run(argv)
    except PerfcastError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        if wants_json(sys.argv[1:] if argv is None else argv):
            print(json.dumps(error_document(exc, 2), indent=2))
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
