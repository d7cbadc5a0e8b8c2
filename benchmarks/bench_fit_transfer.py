#!/usr/bin/env python3
"""Does learning from one set of runs carry to other jobs on the same machine?

``perf-calibrate validate --fit`` (and ``harvest --refit``) fits a platform's end-to-end factors, a
compute scale, the per-layer, per-micro-batch and per-launch host costs' scales and the network
scale, on recorded runs.  A few physical factors cannot memorise jobs; this benchmark checks that they also do not
only help the runs they were fitted on: the runs are split in two by what the jobs are (small
against large models, one depth against others, micro-batch sizes and counts, attention paths,
models and layouts), the factors are fitted on one side with the acceptance rule of
``validate --fit``, and the *other* side is predicted before and after.  dgx-h100 is split on its
recorded runs, perlmutter-a100 and vista-gh200 on the paper's runs (benchmarks/data/).

    python benchmarks/bench_fit_transfer.py [--platform dgx-h100 ...] [--cpu-family]
    python benchmarks/bench_fit_transfer.py --stacks [--runs-per-fit 10 15] [--draws 20]
    python benchmarks/bench_fit_transfer.py --stacks --stacks-platform dgx-h100 \
        --stacks-runs benchmarks/data/h100-lent/stacks/stacks-runs.toml [--stacks-skip ddp]

``--stacks``: the CPU family trained under several software stacks
(benchmarks/data/cpu-family/stacks-dp1.toml, or ``--stacks-runs .../stacks.toml`` for the mixed
dp 1/2 family; ``bench_cpu_family.py --stacks``), on the platform fitted from the samples
calibrated the same day on the same machine (cpu-family/samples-stacks); with ``--stacks-platform
dgx-h100`` the lent H100's family under four stacks (calibrate/stack_runs.py) on the shipped
platform, its own recorded runs and fit dropped.  For each kind (predictor/kinds.py) and each N of ``--runs-per-fit``,
``--draws`` random draws of N of its runs are fitted as ``validate --fit`` does (the per-kind
hierarchical fit, kept only when leave-one-out improves; the runs recorded with their
leave-one-out predictions); then that kind's other runs and every other kind's runs are
predicted before and after, with the 90 % interval's coverage.

A fit's scales apply only to jobs inside the domain of the runs they were fitted on
(predictor.platform.FitDomain); a job outside it is predicted as before, so a split's held-out
side can stay unchanged even where the fit was kept.

A benchmark, not a test: it prints what it measured.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path
from typing import Callable, Sequence

from calibrate.validate import _MAX_STD, fit_terms, load_runs
from predictor import load_platform, predict_many
from predictor.kinds import kind_of
from predictor.validation import MeasuredRun

ROOT = Path(__file__).resolve().parents[1]

# (name, predicate): a run is on the fitted side when the predicate holds; the split is then also
# run the other way round.
SPLITS: list[tuple[str, Callable[[MeasuredRun], bool]]] = [
    ("hidden <= 2048 | > 2048", lambda r: r.job.model.hidden <= 2048),
    ("micro-batch 1 | > 1", lambda r: r.job.layout.micro_batch == 1),
    ("flash attention | other paths", lambda r: r.job.model.attention == "flash"),
    ("4 layers | other depths", lambda r: r.job.model.layers == 4),
    ("<= 4 layers | > 4 layers", lambda r: r.job.model.layers <= 4),
    ("seq 1024 | longer", lambda r: r.job.model.seq_len <= 1024),
    ("gelu | swiglu", lambda r: r.job.model.activation != "swiglu"),
    ("2 micro-batches | more", lambda r: r.job.layout.micro_batches <= 2),
    ("GPT-20B | other models", lambda r: r.name.startswith("GPT-20B")),
    ("tp <= 2 | tp > 2", lambda r: r.job.layout.tp <= 2),
    ("pp <= 4 | pp > 4", lambda r: r.job.layout.pp <= 4),
    ("dp <= 4 | dp > 4", lambda r: r.job.layout.dp <= 4),
    ("hidden <= 256 | > 256", lambda r: r.job.model.hidden <= 256),
    ("dp 1 | dp > 1", lambda r: r.job.layout.dp == 1),
    ("no recompute | recompute", lambda r: r.job.layout.recompute == "none"),
]
# The paper's runs of the platforms that have no recorded runs of their own beyond them.
PAPER_RUNS = {"perlmutter-a100": "paper-runs-perlmutter-a100.toml", "vista-gh200": "paper-runs-vista-gh200.toml"}
# "Noticeably worse": more than this many points of held-out MAPE.
WORSE = 0.005


def _mape(runs: Sequence[MeasuredRun], predicted: Sequence[float]) -> float:
    return sum(abs(p / r.measured_iteration_seconds - 1) for r, p in zip(runs, predicted)) / len(runs)


def _terms(res) -> str:
    return (f"{res.compute_scale:>8.3f}{res.host_layer_scale:>7.3f}{res.host_micro_batch_scale:>7.3f}"
            f"{res.host_launch_scale:>7.3f}{res.network_scale:>8.3f}")


def _why(res) -> str:
    """The factors enough runs see but the fit left at 1, and why (-: none)."""
    out = []
    for f, std in res.identification.items():
        if f not in res.fitted:
            out.append(f"{f.replace('_scale', '').replace('host_', '')} "
                       + ("collinear" if std is None else "unidentified" if std > _MAX_STD else "insignificant"))
    return "at 1: " + (", ".join(out) or "-")


def bench(name: str, runs: list[MeasuredRun], plat) -> tuple[int, int, int, int, list[float]]:
    print(f"\n{name}: {len(runs)} runs; factors fitted on one side, MAPE on the other "
          f"(layer/micro-batch/launch: the host factors; network: between nodes)")
    print(f"{'split (fitted side first)':<32}{'fit':>4}{'test':>5}{'compute':>8}{'layer':>7}{'mb':>7}"
          f"{'launch':>7}{'network':>8}{'MAPE before':>12}{'after':>8}  terms")
    better = worse = noticeably = total = 0
    deltas = []
    for label0, pred in SPLITS:
        sides = ([r for r in runs if pred(r)], [r for r in runs if not pred(r)])
        for flip in (False, True):
            train, test = sides[::-1] if flip else sides
            if len(train) < 3 or not test:
                continue
            res = fit_terms(plat, train)
            # As validate --fit and harvest --refit do: the terms are kept only when they improve
            # leave-one-out error on the runs they were fitted on.
            accepted = res.improves
            fitted = dataclasses.replace(plat, fitted=res.terms()) if accepted else plat
            before = _mape(test, [p.iteration_seconds for p in predict_many([r.job for r in test], plat)])
            after = _mape(test, [p.iteration_seconds for p in predict_many([r.job for r in test], fitted)])
            label = label0 if not flip else " | ".join(reversed(label0.split(" | ")))
            print(f"{label[:31]:<32}{len(train):>4}{len(test):>5}{_terms(res)}"
                  f"{100 * before:>11.2f}%{100 * after:>7.2f}%  "
                  + (f"kept (LOO {100 * res.mape_before:.2f}% -> {100 * res.loo_mape_after:.2f}%)" if accepted
                     else f"declined (LOO {100 * res.mape_before:.2f}% -> {100 * res.loo_mape_after:.2f}%"
                          f" ± {100 * res.loo_change_se:.2f})")
                  + ("" if not res.identification else
                     "; " + _why(res)))
            total += 1
            better += after < before - 1e-12
            worse += after > before + 1e-12
            noticeably += after > before + WORSE
            deltas.append(after - before)
    print(f"held-out side: better after the fit in {better} of {total} splits, worse in {worse} "
          f"({noticeably} by more than {100 * WORSE:.1f} points), unchanged in {total - better - worse}; "
          f"mean change {100 * sum(deltas) / max(len(deltas), 1):+.2f} points, "
          f"worst {100 * max(deltas, default=0):+.2f}")
    return better, worse, noticeably, total, deltas


# The stack families whose kinds' spreads ship (predictor.interval.SHIPPED_KIND_SPREADS): the
# runs file, and the platform that predicts them ("samples:DIR": fitted from that sample store).
SPREAD_DATA = (("benchmarks/data/cpu-family/stacks-dp1.toml", "samples:benchmarks/data/cpu-family/samples-stacks"),
               ("benchmarks/data/h100-lent/stacks/stacks-runs.toml", "dgx-h100"))


def _spread_platform(spec: str, keep: list):
    if spec.startswith("samples:"):
        from calibrate.cpu_family import resolve_platform
        return resolve_platform(str(ROOT / spec.split(":", 1)[1]), keep)
    return load_platform(spec)


def print_kind_spreads() -> None:
    """SHIPPED_KIND_SPREADS as measured now (each score rounded up at the 4th decimal)."""
    import math

    from calibrate.fitting.kinds import kind_spreads
    keep: list = []
    print("SHIPPED_KIND_SPREADS: tuple[KindSpread, ...] = (")
    for runs_file, spec in SPREAD_DATA:
        folder = str(Path(runs_file).parent)
        for sp in kind_spreads(_spread_platform(spec, keep), load_runs(ROOT / runs_file), folder):
            print(f"    KindSpread({sp.dataset!r}, {sp.kind!r}, {math.ceil(sp.score * 1e4) / 1e4}, {sp.runs}),")
    print(")")


def bench_stacks(plat, runs: list[MeasuredRun], sizes: Sequence[int], draws: int, runs_file: str = "") -> None:
    """Fit on N runs of one kind, predict that kind's other runs and the other kinds' runs.

    The unseen-kind bound pools the site's kinds with the shipped kinds measured on *other* data
    (those of ``runs_file``'s folder left out), so that no interval is judged on its own data."""
    import random

    from calibrate.fitting.kinds import fit_hierarchical
    from predictor.interval import SHIPPED_KIND_SPREADS

    spreads = _other_spreads(runs_file)

    by_kind: dict[str, list[MeasuredRun]] = {}
    for r in runs:
        by_kind.setdefault(kind_of(r.job).key, []).append(r)
    print(f"\nstacks: {len(runs)} runs of {len(by_kind)} kinds: "
          + ", ".join(f"{k} ({len(v)})" for k, v in sorted(by_kind.items())))
    print(f"shipped kinds pooled into the unseen-kind bound: {len(spreads)} of {len(SHIPPED_KIND_SPREADS)} "
          f"(those measured on these runs left out)")
    print(f"{'kind fitted':<34}{'N':>3}{'kept':>8}{'same kind: MAPE before':>24}{'after':>8}{'cut':>6}{'covered':>9}"
          f"{'other kinds: MAPE before':>26}{'after':>8}{'covered':>9}")

    def mape(rs, preds):
        return sum(abs(p.iteration_seconds / r.measured_iteration_seconds - 1) for r, p in zip(rs, preds)) / len(rs)

    def covered(rs, preds):
        return sum(p.interval_seconds[0] <= r.measured_iteration_seconds <= p.interval_seconds[1]
                   for r, p in zip(rs, preds))

    pooled: dict[int, list[int]] = {n: [0, 0, 0, 0] for n in sizes}     # same covered / runs, other
    for key, own in sorted(by_kind.items()):
        for n in sizes:
            if len(own) <= n:
                continue
            rng = random.Random(f"{key}/{n}")
            acc = {"kept": 0, "sb": 0.0, "sa": 0.0, "sc": 0, "sn": 0, "ob": 0.0, "oa": 0.0, "oc": 0, "on": 0}
            for _ in range(draws):
                train = rng.sample(own, n)
                test = [r for r in own if r not in train]
                other = [r for r in runs if kind_of(r.job).key != key]
                res = fit_hierarchical(plat, train, spreads=spreads)
                # Declined: the runs recorded with the platform's own predictions, the factors at
                # 1 but the per-kind intervals kept (HierarchicalFit.interval_terms); kept: the fit,
                # the runs with their leave-one-out predictions (validate --fit).
                fitted = dataclasses.replace(plat, fitted=res.interval_terms(plat.fitted), validation=[
                    dataclasses.replace(r, predicted_iteration_seconds=p.iteration_seconds)
                    for r, p in zip(train, predict_many([r.job for r in train], plat))])
                if res.improves:
                    acc["kept"] += 1
                    fitted = dataclasses.replace(plat, fitted=res.terms(), validation=[
                        dataclasses.replace(r, predicted_iteration_seconds=p) for r, p in zip(train, res.loo_predictions)])
                for rs, b, a, c, cnt in ((test, "sb", "sa", "sc", "sn"), (other, "ob", "oa", "oc", "on")):
                    if not rs:
                        continue
                    before = predict_many([r.job for r in rs], plat)
                    after = predict_many([r.job for r in rs], fitted)
                    acc[b] += mape(rs, before) / draws
                    acc[a] += mape(rs, after) / draws
                    acc[c] += covered(rs, after)
                    acc[cnt] += len(rs)
            cut = 1 - acc["sa"] / acc["sb"] if acc["sb"] else 0.0
            pooled[n] = [a + b for a, b in zip(pooled[n], (acc["sc"], acc["sn"], acc["oc"], acc["on"]))]
            print(f"{key[:33]:<34}{n:>3}{acc['kept']:>4}/{draws:<3}{100 * acc['sb']:>23.1f}%{100 * acc['sa']:>7.1f}%"
                  f"{100 * cut:>5.0f}%{100 * acc['sc'] / max(acc['sn'], 1):>8.0f}%"
                  f"{100 * acc['ob']:>25.1f}%{100 * acc['oa']:>7.1f}%{100 * acc['oc'] / max(acc['on'], 1):>8.0f}%")
    for n, (sc, sn, oc, on) in pooled.items():
        if sn:
            print(f"N = {n}, every kind fitted pooled: same kind covered {100 * sc / sn:.1f} % of {sn}, "
                  f"other kinds {100 * oc / max(on, 1):.1f} % of {on}")


def _fill_kills(runs: Sequence[MeasuredRun], preds, margin: float, level: float) -> int:
    """Runs the fill's limit would have killed (calibrate.fitting.kinds.filled_iteration_seconds:
    its start-up allowance and rounding left out, so at least as many kills as the real fill)."""
    from calibrate.fitting.kinds import filled_iteration_seconds
    return sum(r.measured_iteration_seconds > filled_iteration_seconds(p.iteration_seconds, p.interval_seconds[1],
                                                                       margin, level)
               for r, p in zip(runs, preds))


def _other_spreads(runs_file: str) -> list:
    """The shipped kinds' spreads measured on other data than ``runs_file``'s folder (so that no
    interval is judged on its own data)."""
    from predictor.interval import SHIPPED_KIND_SPREADS
    path = Path(runs_file).resolve() if runs_file else None
    # A runs file outside the repository is none of the shipped spreads' data.
    rel = str(path.relative_to(ROOT)) if path is not None and path.is_relative_to(ROOT) else ""
    return [sp for sp in SHIPPED_KIND_SPREADS if not rel.startswith(sp.dataset + "/")]


def bench_site(plat, runs: list[MeasuredRun], sizes: Sequence[int], draws: int, runs_file: str = "",
               level: float = 0.0) -> None:
    """A site's finished jobs of mixed kinds: fit on N of them with the platform's recorded runs as
    ``validate --fit`` does (the fit and the runs' leave-one-out predictions written only when
    leave-one-out improves; otherwise the runs, recorded with the platform's predictions, and
    their kinds' intervals),
    then predict the site's other jobs: MAPE, interval coverage and the default fill's kills,
    before (the platform as it is) and after."""
    import random

    from calibrate.fitting.kinds import fit_hierarchical
    from slurm_plugin.siteconfig import PartitionPolicy

    default = PartitionPolicy()
    margin, level = default.margin, level or default.fill_level
    spreads = _other_spreads(runs_file)
    print(f"\nsite: {len(runs)} runs; fit on N drawn at random (all kinds mixed), predict the others; "
          f"fill = max(point x {1 + margin:g}, the upper bound at {100 * level:g} %); 'upper': the median "
          "interval's upper end / point after")
    print(f"{'N':>3}{'draws':>6}{'kept':>6}{'MAPE before':>13}{'after':>8}{'covered before':>16}{'after':>8}"
          f"{'fill kills before':>19}{'after':>8}{'upper':>8}{'worst kind after':>30}")
    for n in sizes:
        if len(runs) <= n:
            continue
        rng = random.Random(f"site/{n}")
        kept = 0
        tot = {"n": 0, "mb": 0.0, "ma": 0.0, "cb": 0, "ca": 0, "kb": 0, "ka": 0}
        per_kind: dict[str, list[float]] = {}
        killed: dict[str, int] = {}
        ups: list = []
        for _ in range(draws):
            train = rng.sample(runs, n)
            test = [r for r in runs if r not in train]
            # As validate --fit: the platform's recorded runs and the site's, fitted and recorded together.
            fit_runs = list(plat.validation) + train
            res = fit_hierarchical(plat, fit_runs, spreads=spreads)
            recorded = [dataclasses.replace(r, predicted_iteration_seconds=p.iteration_seconds)
                        for r, p in zip(fit_runs, predict_many([r.job for r in fit_runs], plat))]
            # Declined: the runs recorded with their kinds' intervals, every factor as it was.
            site = dataclasses.replace(plat, validation=recorded, fitted=res.interval_terms(plat.fitted))
            if res.improves:
                kept += 1
                site = dataclasses.replace(plat, fitted=res.terms(), validation=[
                    dataclasses.replace(r, predicted_iteration_seconds=p) for r, p in zip(fit_runs, res.loo_predictions)])
            before = predict_many([r.job for r in test], plat)
            after = predict_many([r.job for r in test], site)
            ups.extend(p.interval_seconds[1] / p.iteration_seconds for p in after)
            for r, p in zip(test, after):
                kind = kind_of(r.job).key
                per_kind.setdefault(kind, []).append(abs(p.iteration_seconds / r.measured_iteration_seconds - 1))
                if _fill_kills([r], [p], margin, level):
                    killed[kind] = killed.get(kind, 0) + 1
            tot["n"] += len(test)
            tot["mb"] += _mape(test, [p.iteration_seconds for p in before]) * len(test)
            tot["ma"] += _mape(test, [p.iteration_seconds for p in after]) * len(test)
            for key, preds in (("b", before), ("a", after)):
                tot["c" + key] += sum(p.interval_seconds[0] <= r.measured_iteration_seconds <= p.interval_seconds[1]
                                      for r, p in zip(test, preds))
                tot["k" + key] += _fill_kills(test, preds, margin, level)
        worst = max(per_kind.items(), key=lambda kv: sum(kv[1]) / len(kv[1]))
        m = tot["n"]
        print(f"{n:>3}{draws:>6}{kept:>6}{100 * tot['mb'] / m:>12.1f}%{100 * tot['ma'] / m:>7.1f}%"
              f"{100 * tot['cb'] / m:>15.1f}%{100 * tot['ca'] / m:>7.1f}%{100 * tot['kb'] / m:>18.1f}%"
              f"{100 * tot['ka'] / m:>7.1f}%{statistics.median(ups):>8.2f}   {worst[0][:20]} "
              f"{100 * sum(worst[1]) / len(worst[1]):.1f}%")
        if killed:
            # where the fill's kills after the fit fall: kind, kills, and that kind's share killed
            top = sorted(killed.items(), key=lambda kv: -kv[1])[:4]
            print("      kills after by kind: " + ", ".join(
                f"{k} {c} ({100 * c / len(per_kind[k]):.0f} %)" for k, c in top))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", action="append",
                    help="platform(s) to split (default: dgx-h100 and the paper platforms)")
    ap.add_argument("--cpu-family", action="store_true",
                    help="also this machine's real CPU training steps (benchmarks/data/cpu-family), on a "
                         "platform fitted from the samples they were calibrated with")
    ap.add_argument("--stacks", action="store_true",
                    help="fit on N runs of one stack, predict its other runs and the other stacks' "
                         "(benchmarks/data/cpu-family/stacks.toml)")
    ap.add_argument("--stacks-runs", default=str(ROOT / "benchmarks" / "data" / "cpu-family" / "stacks-dp1.toml"),
                    help="--stacks: the runs file (GPU: benchmarks/data/h100-lent/stacks/stacks-runs.toml)")
    ap.add_argument("--stacks-platform", default="",
                    help="--stacks: predict with this shipped platform (e.g. dgx-h100, its recorded runs "
                         "and fit dropped) instead of the CPU samples' (--samples)")
    ap.add_argument("--stacks-skip", action="append", default=[], metavar="STACK",
                    help="--stacks: leave out the runs named \"STACK ...\" (e.g. ddp, whose kind is "
                         "pytorch's: calibrate/stack_runs.py)")
    ap.add_argument("--site", action="store_true",
                    help="--stacks runs as one site's jobs: fit on N drawn across all kinds, predict the rest "
                         "(MAPE, coverage, the default fill's kills)")
    ap.add_argument("--fill-level", type=float, default=0.0,
                    help="--site: the fill's level (perfcast.toml fill_level; default the shipped default)")
    ap.add_argument("--runs-per-fit", type=int, nargs="+", default=[10])
    ap.add_argument("--draws", type=int, default=20, help="--stacks: random draws per kind and N")
    ap.add_argument("--dp", type=int, default=0, help="--stacks: only the runs of this data-parallel size")
    ap.add_argument("--samples", default=str(ROOT / "benchmarks" / "data" / "cpu-family" / "samples-stacks"),
                    help="--stacks: the sample store the platform is fitted from (default: the one "
                         "calibrated on the machine and day the stacks were measured)")
    ap.add_argument("--kind-spreads", action="store_true",
                    help="print predictor.interval.SHIPPED_KIND_SPREADS as measured from the stack families")
    args = ap.parse_args()
    if args.kind_spreads:
        print_kind_spreads()
        return 0
    if args.stacks:
        keep_: list = []
        if args.stacks_platform:
            # --site: the shipped platform as a site has it, its recorded runs kept (validate --fit
            # fits them with the site's); otherwise dropped, so that only the stacks' runs are fitted.
            plat = load_platform(args.stacks_platform)
            plat = dataclasses.replace(plat, fitted=None, validation=plat.validation if args.site else [])
        else:
            from calibrate.cpu_family import resolve_platform
            plat = dataclasses.replace(resolve_platform(args.samples, keep_), fitted=None, validation=[])
        skip = tuple(f"{s} " for s in args.stacks_skip)
        runs = [r for r in load_runs(args.stacks_runs)
                if (not args.dp or r.job.layout.dp == args.dp) and not r.name.startswith(skip)]
        if args.site:
            bench_site(plat, runs, args.runs_per_fit, args.draws, args.stacks_runs, args.fill_level)
        else:
            bench_stacks(plat, runs, args.runs_per_fit, args.draws, args.stacks_runs)
        return 0
    if args.cpu_family:
        from calibrate.cpu_family import resolve_platform
        keep: list = []          # the temporary platform directory lives as long as this list
        data = ROOT / "benchmarks" / "data" / "cpu-family"
        plat = dataclasses.replace(resolve_platform(str(data / "samples"), keep), fitted=None)
        bench("cpu-family", load_runs(data / "runs.toml"), plat)
        if not args.platform:
            return 0
    names = args.platform or ["dgx-h100", *PAPER_RUNS]
    for name in names:
        plat = dataclasses.replace(load_platform(name), fitted=None)
        runs = (load_runs(ROOT / "benchmarks" / "data" / PAPER_RUNS[name]) if name in PAPER_RUNS
                else list(plat.validation))
        bench(name, runs, plat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
