"""perf-advise: which PP-TP-DP(-CP) layout (and micro-batch, recompute, ZeRO, interleaving) to run.

    perf-advise JOB [--gpus N | --nodes N] [--platform P | --partition P] [--top K]
                    [--json | --csv] [--plot FILE.png] [--all] [--allow-cross-node-tp]
                    [--micro-batch N] [--recompute R] [--zero-stage Z] [--virtual-stages V]
                    [--pin KNOB,...]

JOB is a TOML job file (``*.toml``) or a batch script (parsed, never run).  ``--gpus 64,128,256``
(or ``--nodes 16,32,64``) sweeps GPU counts and reports time-to-train and GPU-hours per count.
Bad input: one line ``perf-advise: ...`` on stderr and exit code 2.

Columns, in the words of the JSON keys (``micro_batch``, ``micro_batches``, ``recompute``,
``zero_stage``, ``virtual_stages``, ``iteration_seconds``, ``bubble_share``, ``comm_share``) and
of perf-predict's text: s/iteration (predicted seconds per iteration, i.e. optimizer step; every
layout keeps the job's global batch, so this ranks them), tokens/s, TFLOP/s/GPU and MFU (model
FLOPs, recomputation not counted; formula in predictor.advise), GiB/GPU (predictor.memory's peak
of the worst stage, ✗ = does not fit), bubble share (pipeline fill/drain share of the iteration),
comm share (the share of TP allreduce, PP p2p, DP exposed and gradient reduce outside the bubble).  ``--json`` prints
``{"candidates": [...], "current": {..., "rank": K}, ...}`` fastest first; a sweep prints
``{"platform": ..., "sweep": [{"gpus", "nodes", "best", "iteration_seconds", "train_seconds",
"gpu_hours"}, ...]}``.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import math
import os
import sys
from typing import Any, Optional, Sequence

from predictor.errors import OneLineParser

from .jobinput import UsageError, load_job_and_platform, load_job_input
from .policy import plural, slurm_duration

PROG = "perf-advise"
#: What matplotlib's Agg backend writes, by the file name's extension (its ``savefig`` table).
PLOT_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "eps", "ps", "tif", "tiff")
KNOBS = ("micro_batch", "recompute", "zero_stage", "virtual_stages", "pp", "tp", "cp")


def _counts(text: str) -> list[int]:
    try:
        # An empty entry ("64,,128", "64,") is a number left out, not a separator to skip.
        values = [int(v) for v in text.replace(" ", "").split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or a comma-separated list, got {text!r}")
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"counts must be positive integers, got {text!r}")
    return values


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description="Rank PP×TP×DP layouts of a training job by predicted "
                "time per step on a Slurm partition's platform.")
    p.add_argument("job", metavar="JOB", help="TOML job file or batch script")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--gpus", type=_counts, help="GPU count, or a comma-separated list to sweep")
    size.add_argument("--nodes", type=_counts, help="node count, or a comma-separated list to sweep")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--platform", help="platform name or path (default: the job's)")
    where.add_argument("--partition", help="Slurm partition, mapped to a platform by the site config")
    p.add_argument("--config", help="site config (default: $PERFCAST_CONFIG, /etc/perfcast/perfcast.toml)")
    p.add_argument("--top", type=_positive, default=10,
                   help="layouts to show, in every output format (default 10)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument("--csv", action="store_true", help="print CSV")
    p.add_argument("--plot", metavar="FILE.png", help="write a chart (sweep: time and GPU-hours per count)")
    p.add_argument("--all", action="store_true", help="also show layouts that do not fit in memory")
    p.add_argument("--allow-cross-node-tp", action="store_true",
                   help="let tensor parallelism span nodes")
    p.add_argument("--micro-batch", type=_positive, help="pin the micro-batch size")
    p.add_argument("--recompute", choices=("none", "selective", "full"), help="pin recomputation")
    p.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), help="pin the ZeRO stage")
    p.add_argument("--virtual-stages", type=_positive, help="pin the interleaving (1 = plain 1F1B)")
    p.add_argument("--cp", type=_positive, help="pin context parallelism (1 = none; needs flash attention)")
    p.add_argument("--pin", default="", help=f"keep the job's own value of these knobs "
                   f"(comma-separated: {', '.join(KNOBS)})")
    p.add_argument("-v", "--verbose", action="store_true", help="log the search")
    return p


# ----------------------------------------------------------------------------------- inputs
def search_options(args: argparse.Namespace, job: Any, gpus: Optional[int]):
    from predictor.advise import SearchOptions
    pinned: dict[str, Any] = {}
    for knob in [k.strip().replace("-", "_") for k in args.pin.split(",") if k.strip()]:
        if knob not in KNOBS:
            raise UsageError(f"--pin: unknown knob {knob!r} (one of {', '.join(KNOBS)})")
        pinned[knob] = getattr(job.layout, knob)
    for knob in ("micro_batch", "recompute", "zero_stage", "virtual_stages", "cp"):
        value = getattr(args, knob)
        if value is not None:
            pinned[knob] = value
    return SearchOptions(gpus=gpus, allow_cross_node_tp=args.allow_cross_node_tp,
                         include_unfit=args.all, **pinned)


# ----------------------------------------------------------------------------------- output
def _fmt_rate(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def _pct(x: float) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.0f}%"


def _hours(seconds: Optional[float]) -> str:
    """A time to train in Slurm's spelling (D-HH:MM:SS), as everywhere perfcast writes a duration."""
    if seconds is None:
        return "-"
    return slurm_duration(seconds)


_HEADER = ("rank", "PP-TP-DP", "micro-batch", "micro-batches", "recompute", "ZeRO", "virtual stages",
           "s/iteration", "tokens/s", "TFLOP/s/GPU", "MFU", "GiB/GPU", "bubble share", "comm share")


def _row(rank: str, c: Any) -> tuple[str, ...]:
    lay = c.layout
    pred = c.prediction is not None
    fit = "" if c.fits else " ✗"
    return (rank, c.name, str(lay.micro_batch), str(lay.micro_batches), lay.recompute,
            str(lay.zero_stage), str(lay.virtual_stages),
            f"{c.iteration_seconds:.3f}" if pred else "-",
            _fmt_rate(c.tokens_per_second) if pred else "-",
            f"{c.tflops_per_gpu:.1f}" if pred else "-",
            _pct(c.mfu) if pred else "-",
            f"{c.memory.total_gib:.1f}{fit}",
            _pct(c.bubble_share) if pred else "-",
            _pct(c.comm_share) if pred else "-")


def _layout_header(candidates: Any) -> str:
    """PP-TP-DP, or PP-TP-DP-CP when a listed layout uses context parallelism (Candidate.name)."""
    return "PP-TP-DP-CP" if any(c is not None and c.layout.cp > 1 for c in candidates) else "PP-TP-DP"


def _recompute_words(recompute: str) -> str:
    return "no recompute" if recompute == "none" else f"{recompute} recompute"


def _table(rows: Sequence[Sequence[str]], left: Sequence[int] = (1, 4)) -> str:
    """Columns padded to width; text columns (``left``) left-aligned, numbers right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(cell.rjust(w) if i not in left else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(r, widths))).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_advice(advice: Any, top: int) -> str:
    job = advice.job
    m = job.model
    nodes = math.ceil(advice.gpus / advice.gpus_per_node)
    head = (f"{m.layers} layers × hidden {m.hidden}, seq {m.seq_len}, global batch "
            f"{job.layout.global_batch} on {plural(advice.gpus, 'GPU')} ({plural(nodes, 'node')} of "
            f"{advice.gpus_per_node}) of {advice.platform}")
    shown = advice.candidates[:top]
    cur = advice.current
    header = list(_HEADER)
    header[1] = _layout_header(shown + ([cur] if cur is not None else []))
    rows = [tuple(header)]
    rank = 0
    for c in shown:
        rank += c.fits
        rows.append(_row(str(rank) if c.fits else "✗", c))
    cur = advice.current
    if cur is not None and not any(c.key == cur.key for c in shown):
        rows.append(_row(str(advice.current_rank) if advice.current_rank else "✗", cur))
    out = [head, ""]
    out.append(_table(rows) if len(rows) > 1 else "no layout fits")
    nfit = len(advice.fitting)
    out.append("")
    # enumerated = predicted + dropped (dominated, over memory): the numbers add up
    parts = [f"{nfit} fit and were predicted"] + [f"{n} {why}" for why, n in sorted(advice.dropped.items())]
    verb = "meets" if advice.enumerated == 1 else "meet"
    out.append(f"{plural(advice.enumerated, 'layout')} {verb} the launch constraints: " + "; ".join(parts))
    if advice.ruled_out:
        out.append("ruled out before (combinations that cannot launch): " +
                   "; ".join(f"{n} {why}" for why, n in sorted(advice.ruled_out.items())))
    if cur is not None:
        listed = any(c.key == cur.key for c in advice.candidates)
        total = nfit if listed else nfit + 1
        where = f"ranks {advice.current_rank} of {total}" if advice.current_rank else "does not fit"
        line = (f"your layout {cur.name} (micro-batch {cur.layout.micro_batch}, {_recompute_words(cur.layout.recompute)}, "
                f"ZeRO {cur.layout.zero_stage}) {where}: {cur.iteration_seconds:.3f} s/iteration")
        best = advice.best
        if best is not None and advice.current_rank and advice.current_rank > 1:
            gain = cur.iteration_seconds / best.iteration_seconds - 1
            line += f"; {best.name} is {100 * gain:.0f}% faster"
            saved = advice.gpu_hours_saved
            if saved is not None:
                line += f" and saves {saved:,.0f} GPU-hours over {advice.iterations:,} iterations"
            else:
                line += " (set run.train_iters to see the GPU-hours it saves)"
        elif advice.current_rank == 1 and total > 1:
            line += "; it is the best layout found"
        elif advice.current_rank == 1:
            line += "; no other layout to compare it with"
        out.append(line)
    for note in advice.notes:
        out.append(f"note: {note}")
    warnings = advice.warnings
    for w in warnings[:3]:                 # the first ones say the most (calibration, precision)
        out.append(f"warning: {w}")
    if len(warnings) > 3:
        out.append(f"warning: ... and {len(warnings) - 3} more about the prediction (see --json)")
    return "\n".join(out)


def render_sweep(points: Sequence[Any]) -> str:
    rows = [("GPUs", "nodes", "best " + _layout_header(p.best for p in points), "micro-batch", "recompute",
             "ZeRO", "virtual stages", "s/iteration", "time to train", "GPU-hours", "efficiency")]
    base = next((p for p in points if p.best is not None), None)
    for p in points:
        if p.best is None:
            rows.append((str(p.gpus), str(p.nodes), "no fit", "", "", "", "", "-", "-", "-", "-"))
            continue
        lay = p.best.layout
        eff = (base.gpu_hours / p.gpu_hours) if base and p.gpu_hours else math.nan
        rows.append((str(p.gpus), str(p.nodes), p.best.name, str(lay.micro_batch), lay.recompute,
                     str(lay.zero_stage), str(lay.virtual_stages), f"{p.step_seconds:.3f}",
                     _hours(p.train_seconds), f"{p.gpu_hours:,.0f}", _pct(eff)))
    text = _table(rows, left=(2, 4))
    iters = points[0].iterations if points else 0
    foot = (f"over {iters:,} iterations; efficiency = GPU-hours at {base.gpus} GPUs ÷ GPU-hours"
            if iters and base else "the job sets no iteration count: times are for one step")
    return text + "\n" + foot


def advice_csv(advice: Any, top: int) -> str:
    buf = io.StringIO()
    rows, rank = [], 0
    for c in advice.candidates[:top]:
        rank += c.fits
        rows.append(dict(c.to_dict(), rank=rank if c.fits else None))
    keys = ["rank", "pp", "tp", "dp", "micro_batch", "micro_batches", "recompute", "zero_stage",
            "virtual_stages", "iteration_seconds", "memory_gib", "fits", "tokens_per_second",
            "tflops_per_gpu", "mfu", "bubble_share", "comm_share"]
    w = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue().rstrip("\n")


def sweep_csv(points: Sequence[Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["gpus", "nodes", "pp", "tp", "dp", "micro_batch", "micro_batches", "recompute",
                "zero_stage", "virtual_stages", "iteration_seconds", "train_seconds", "gpu_hours"])
    for p in points:
        b = p.best
        lay = [getattr(b.layout, k) for k in ("pp", "tp", "dp", "micro_batch", "micro_batches",
                                              "recompute", "zero_stage", "virtual_stages")] if b else [""] * 8
        w.writerow([p.gpus, p.nodes, *lay, p.step_seconds, p.train_seconds, p.gpu_hours])
    return buf.getvalue().rstrip("\n")


# ----------------------------------------------------------------------------------- main
def run(argv: Optional[Sequence[str]] = None, predict_many: Any = None, platform: Any = None) -> int:
    """The CLI without sys.exit; ``predict_many``/``platform`` let tests inject fakes."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format=f"{PROG}: %(message)s")
    if args.plot:
        check_plot_path(args.plot)
    from predictor.advise import advise, sweep
    if platform is not None:
        job = load_job_input(args.job, int(platform.gpus_per_node)).job
        plat = platform
    else:
        inp, plat = load_job_and_platform(args.job, args.platform, args.partition, args.config)
        job = inp.job
        if inp.platform_from:
            print(f"{PROG}: {inp.platform_from}", file=sys.stderr)
    gpn = int(plat.gpus_per_node)
    if args.nodes:
        counts: Optional[list[int]] = [n * gpn for n in args.nodes]
    else:
        counts = args.gpus
    if counts and len(counts) > 1:
        points = sweep(job, plat, counts, search_options(args, job, None), predict_many)
        _maybe_plot(args.plot, points=points, job=job, platform=plat)
        if args.json:
            print(json.dumps({"platform": str(getattr(plat, "name", "")),
                              "sweep": [p.to_dict() for p in points]}, indent=1))
        elif args.csv:
            print(sweep_csv(points))
        else:
            print(render_sweep(points))
        return 0
    gpus = counts[0] if counts else None
    advice = advise(job, plat, search_options(args, job, gpus), predict_many)
    _maybe_plot(args.plot, advice=advice, top=args.top)
    if args.json:
        d = advice.to_dict()
        d["candidates"] = d["candidates"][:args.top]
        print(json.dumps(d, indent=1))
    elif args.csv:
        print(advice_csv(advice, args.top))
    else:
        print(render_advice(advice, args.top))
    return 0


def check_plot_path(path: str) -> None:
    """Refuse, before any work, a --plot name matplotlib would refuse or write elsewhere: a
    directory, or a name without an image extension (matplotlib adds ``.png`` to a bare name and
    fails on an unknown one)."""
    if os.path.isdir(path):
        raise UsageError(f"--plot {path}: is a directory; give a file name such as {os.path.join(path, 'advice.png')}")
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in PLOT_FORMATS:
        raise UsageError(f"--plot {path}: the name must end in one of "
                         f"{', '.join('.' + f for f in PLOT_FORMATS)} (the chart's format)")


def _maybe_plot(path: Optional[str], **kw: Any) -> None:
    """The chart, when asked for; without matplotlib the answer stands and one line says so."""
    if not path:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"{PROG}: --plot needs matplotlib (pip install 'perfcast[plot]'); no chart written to {path}",
              file=sys.stderr)
        return
    if "points" in kw:
        plot_sweep(kw["points"], kw["job"], kw["platform"], path)
    else:
        plot_advice(kw["advice"], path, kw["top"])


# ----------------------------------------------------------------------------------- plots
def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib (pip install 'perfcast[plot]')") from None
    matplotlib.use("Agg")  # no display on login nodes; must precede pyplot
    import matplotlib.pyplot as plt
    return plt


def plot_sweep(points: Sequence[Any], job: Any, platform: Any, path: str) -> None:
    """Two panels over GPU count: time to train (with perfect scaling from the smallest count,
    so lost efficiency is the gap) and GPU-hours (the bill), each point labelled with its layout."""
    plt = _pyplot()
    pts = [p for p in points if p.best is not None]
    if not pts:
        raise UsageError("nothing to plot: no GPU count has a layout that fits")
    gpus = [p.gpus for p in pts]
    iters = pts[0].iterations
    scale, unit = ((3600.0, "hours") if iters and max(p.train_seconds for p in pts) >= 3600
                   else (1.0, "seconds"))
    time = [p.train_seconds / scale for p in pts]
    hours = [p.gpu_hours for p in pts]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4), constrained_layout=True)
    ax1.plot(gpus, time, "o-", color="#1f77b4", lw=2, label="best layout (predicted)")
    ideal = [time[0] * gpus[0] / g for g in gpus]
    ax1.plot(gpus, ideal, "--", color="grey", lw=1, label=f"perfect scaling from {gpus[0]} GPUs")
    for g, t, p in zip(gpus, time, pts):
        ax1.annotate(p.best.name, (g, t), textcoords="offset points", xytext=(0, 7),
                     ha="center", fontsize=8)
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xticks(gpus, [str(g) for g in gpus])
    # Plain numbers on the log axis: "60" reads faster than "6×10¹".
    from matplotlib.ticker import FuncFormatter
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax1.yaxis.set_major_formatter(plain)
    ax1.yaxis.set_minor_formatter(plain)
    ax1.tick_params(axis="y", which="minor", labelsize=7)
    ax1.margins(x=0.08, y=0.15)             # room for the layout labels above the points
    ax1.set_xlabel("GPUs")
    ax1.set_ylabel(f"time to train ({unit})" if iters else f"time per step ({unit})")
    ax1.set_title("Time to train" if iters else "Time per step")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    bars = ax2.bar([str(g) for g in gpus], hours, color="#ff7f0e")
    for b, h in zip(bars, hours):
        eff = hours[0] / h if h else 0
        ax2.annotate(f"{h:,.0f}\n({100 * eff:.0f}%)", (b.get_x() + b.get_width() / 2, h),
                     textcoords="offset points", xytext=(0, 2), ha="center", va="bottom", fontsize=8)
    ax2.set_xlabel("GPUs")
    ax2.set_ylabel("GPU-hours" if iters else "GPU-hours per step")
    ax2.set_title("Cost (scaling efficiency vs. smallest count)")
    ax2.set_ylim(0, max(hours) * 1.25)
    ax2.grid(True, axis="y", alpha=0.3)
    m = job.model
    fig.suptitle(f"{m.layers}×{m.hidden} model, global batch {job.layout.global_batch}, "
                 f"{iters:,} iterations on {getattr(platform, 'name', '')}" if iters else
                 f"{m.layers}×{m.hidden} model, global batch {job.layout.global_batch} on "
                 f"{getattr(platform, 'name', '')}")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_advice(advice: Any, path: str, top: int) -> None:
    """Horizontal bars of the top layouts' seconds per step, split into compute, communication,
    bubble and the rest (:meth:`Candidate.time_split`), with the job's own layout labelled:
    where the time goes, not just how much."""
    plt = _pyplot()
    shown = advice.candidates[:top]
    cur = advice.current
    if cur is not None and cur.prediction is not None and all(c.key != cur.key for c in shown):
        shown.append(cur)
    if not shown:
        raise UsageError("nothing to plot: no layout fits")
    labels: list[str] = []
    parts = {"compute": [], "communication": [], "bubble": [], "other": []}
    n_fit = 0
    for c in shown:
        mine = cur is not None and c.key == cur.key
        rc = {"none": "no-rc", "selective": "sel-rc", "full": "full-rc"}[c.layout.recompute]
        n_fit += c.fits
        rank = ((f"#{advice.current_rank}" if advice.current_rank else "✗") if mine
                else (f"#{n_fit}" if c.fits else "✗"))
        labels.append(f"{rank} " + ("yours: " if mine else "") + f"{c.name} mb{c.layout.micro_batch} "
                      f"{rc} z{c.layout.zero_stage}"
                      + (f" v{c.layout.virtual_stages}" if c.layout.virtual_stages > 1 else ""))
        split = c.time_split()
        for k in parts:
            parts[k].append(split.get(k, 0.0))
    y = list(range(len(shown)))[::-1]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(shown) + 1.6), constrained_layout=True)
    left = [0.0] * len(shown)
    colours = {"compute": "#1f77b4", "communication": "#ff7f0e", "bubble": "#bbbbbb",
               "other": "#2ca02c"}
    names = {"compute": "compute", "communication": "communication (TP, PP, DP)",
             "bubble": "pipeline bubble", "other": "optimizer step, overheads"}
    for k, values in parts.items():
        ax.barh(y, values, left=left, color=colours[k], label=names[k])
        left = [a + b for a, b in zip(left, values)]
    ax.set_yticks(y, labels, fontsize=8)
    for yi, c in zip(y, shown):
        ax.annotate(f"{c.iteration_seconds:.2f} s  {c.memory.total_gib:.0f} GiB", (c.iteration_seconds, yi),
                    textcoords="offset points", xytext=(4, -3), fontsize=8)
    ax.set_xlabel("predicted seconds per step")
    ax.set_xlim(0, max(c.iteration_seconds for c in shown) * 1.3)
    ax.set_title(f"Top layouts on {advice.gpus} GPUs of {advice.platform} ")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.09 - 0.4 / len(shown)), ncol=4,
              frameon=False)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from predictor.errors import PerfcastError, error_document, wants_json
    failed: Optional[BaseException] = None
    try:
        code = run(argv)
    except PerfcastError as exc:        # UsageError included
        print(f"{PROG}: {exc}", file=sys.stderr)
        code, failed = 2, exc
    except OSError as exc:  # e.g. --plot into a directory that does not exist
        print(f"{PROG}: {exc.filename or ''}: {exc.strerror or exc}".replace(": : ", ": "), file=sys.stderr)
        code, failed = 2, exc
    except KeyboardInterrupt:
        code = 130
    if failed is not None and wants_json(sys.argv[1:] if argv is None else argv):
        print(json.dumps(error_document(failed, code), indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
