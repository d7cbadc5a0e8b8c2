"""The validation report of a fit: per-model hold-out errors, a table and a predicted-vs-measured plot.

The errors are the fit's own (:class:`~calibrate.fitting.ratio.RatioRegressor` chooses the library
on an 80/20 split and reports that split's MAPE and p90).  For the plot, each model's chosen library is refitted on the
same 80 % and asked about the same 20 %, so every point drawn is a prediction of a sample the
model did not see.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from predictor.operators import OPERATORS, GpuSpec
from predictor.samples import SampleSet, dump_toml

from .bundle import FitReport, collective_training_rows, operator_training_rows
from .ratio import RatioRegressor, holdout_split

log = logging.getLogger(__name__)


@dataclass
class ModelValidation:
    key: str                      # "<op>.<direction>.<precision>" or "<kind>.<precision>"
    kind: str                     # "compute" | "collectives"
    library: str
    samples: int
    mape: float
    p90: float
    measured_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    predicted_s: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass
class ValidationReport:
    models: list[ModelValidation]

    def _weighted(self, kind: str) -> float | None:
        ms = [m for m in self.models if m.kind == kind]
        if not ms:
            return None
        w = np.asarray([m.samples for m in ms], dtype=float)
        return float(np.sum(w * np.asarray([m.mape for m in ms])) / np.sum(w))

    @property
    def compute_mape(self) -> float:
        """Sample-weighted mean hold-out MAPE over the compute models (install compares this)."""
        v = self._weighted("compute")
        return float("nan") if v is None else v

    @property
    def collective_mape(self) -> float | None:
        return self._weighted("collectives")

    def table(self) -> str:
        lines = [f"{'model':<36} {'library':<14} {'samples':>7} {'val MAPE':>9} {'p90':>7}"]
        for kind in ("compute", "collectives"):
            for m in sorted((m for m in self.models if m.kind == kind), key=lambda m: m.key):
                lines.append(f"{m.key:<36} {m.library:<14} {m.samples:>7} {100 * m.mape:>8.2f}% "
                             f"{100 * m.p90:>6.1f}%")
        lines.append(f"{'compute (sample-weighted)':<36} {'':<14} "
                     f"{sum(m.samples for m in self.models if m.kind == 'compute'):>7} "
                     f"{100 * self.compute_mape:>8.2f}%")
        if self.collective_mape is not None:
            lines.append(f"{'collectives (sample-weighted)':<36} {'':<14} "
                         f"{sum(m.samples for m in self.models if m.kind == 'collectives'):>7} "
                         f"{100 * self.collective_mape:>8.2f}%")
        return "\n".join(lines)


def _split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    # The split RatioRegressor chose the library on, so "held out" means the same rows.
    return holdout_split(n, seed)


def _held_out(X: np.ndarray, y: np.ndarray, library: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(measured ratio, predicted ratio) on the validation rows, from a refit on the training rows."""
    finite = np.isfinite(y) & np.all(np.isfinite(X), axis=1)
    X, y = X[finite], y[finite]
    train, val = _split(len(y), seed)
    try:
        est = RatioRegressor((library,), seed=seed, min_samples=2).fit(X[train], y[train])
    except ValueError:
        return np.zeros(0), np.zeros(0)
    # The library's own prediction from its model file: the plot checks the library, the
    # forest is checked against it in the tests.
    return np.exp(y[val]), np.exp(np.asarray(est.library_predict(X[val]), dtype=float))


def held_out_predictions(samples: SampleSet, gpu: GpuSpec, compute: FitReport,
                         collectives: FitReport | None, *, seed: int = 0) -> ValidationReport:
    """Every fitted model's hold-out error, with its held-out points in seconds (for the plot)."""
    out: list[ModelValidation] = []
    for key, info in compute.models.items():
        op_name, direction, precision = key.split(".")
        X, y, raw = operator_training_rows(samples, op_name, direction, precision, gpu)
        op = OPERATORS[op_name]
        measured_r, pred_r = _held_out(X, y, info.library, seed)
        finite = np.isfinite(y) & np.all(np.isfinite(X), axis=1)
        _, val = _split(int(finite.sum()), seed)
        shape = {f: raw[finite][val][:, i] for i, f in enumerate(op.features)}
        roof = op.roofline_seconds(shape, direction, precision, gpu) if len(val) else np.zeros(0)
        m = ModelValidation(key, "compute", info.library, info.samples, info.validation_mape,
                            info.validation_p90)
        if len(measured_r) == len(roof):
            m.measured_s, m.predicted_s = measured_r * roof, pred_r * roof
        out.append(m)
    if collectives is not None and collectives.links is not None:
        from predictor.network import collective_seconds
        from predictor.operators import BYTES_PER_ELEMENT
        for key, info in collectives.models.items():
            kind, precision = key.split(".")
            table = samples.collectives[(kind, precision)].rows
            X, y = collective_training_rows(table, kind, collectives.links, precision)
            measured_r, pred_r = _held_out(X, y, info.library, seed)
            finite = np.isfinite(y) & np.all(np.isfinite(X), axis=1)
            _, val = _split(int(finite.sum()), seed)
            rows = table[finite][val]
            base = collective_seconds(collectives.links, kind, rows[:, 0], rows[:, 1], rows[:, 2],
                                      BYTES_PER_ELEMENT[precision])
            m = ModelValidation(key, "collectives", info.library, info.samples, info.validation_mape,
                                info.validation_p90)
            if len(measured_r) == len(base):
                m.measured_s, m.predicted_s = measured_r * base, pred_r * base
            out.append(m)
    return ValidationReport(out)


def write_report(report: ValidationReport, directory: Path, *, plot: bool = True) -> list[Path]:
    """report.txt (the table), validation.toml (machine-readable) and the PNG; returns the files."""
    directory.mkdir(parents=True, exist_ok=True)
    files = [directory / "report.txt", directory / "validation.toml"]
    files[0].write_text(report.table() + "\n", encoding="utf-8")
    data = {"compute_mape": _finite(report.compute_mape),
            "models": {m.key: {"kind": m.kind, "library": m.library, "samples": m.samples,
                               "validation_mape": _finite(m.mape), "validation_p90": _finite(m.p90)}
                       for m in report.models}}
    if report.collective_mape is not None:
        data["collective_mape"] = _finite(report.collective_mape)
    files[1].write_text(dump_toml(data), encoding="utf-8")
    if plot:
        png = directory / "predicted_vs_measured.png"
        if plot_predicted_vs_measured(report, png):
            files.append(png)
    return files


def _finite(v: float) -> float:
    return float(v) if np.isfinite(v) else -1.0


def plot_predicted_vs_measured(report: ValidationReport, path: Path) -> bool:
    """Log-log scatter of held-out predictions against measurements, compute and collectives."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no %s (pip install perfcast[plot])", path.name)
        return False
    kinds = [k for k in ("compute", "collectives") if any(m.kind == k and len(m.measured_s) for m in report.models)]
    if not kinds:
        return False
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.5 * len(kinds), 6), squeeze=False)
    cmap = plt.get_cmap("tab20")
    for ax, kind in zip(axes[0], kinds):
        ms = [m for m in report.models if m.kind == kind and len(m.measured_s)]
        ops = sorted({m.key.split(".")[0] for m in ms})
        lo, hi = np.inf, 0.0
        for m in ms:
            name = m.key.split(".")[0]
            c = cmap(ops.index(name) % 20)
            meas, pred = m.measured_s * 1e6, m.predicted_s * 1e6
            ax.scatter(meas, pred, s=12, color=c, alpha=0.8,
                       label=name if m.key.split(".")[1] in ("fwd", "step") or kind == "collectives" else None,
                       marker="o" if ".bwd." not in m.key else "^")
            if len(meas):
                lo = min(lo, meas.min(), pred.min())
                hi = max(hi, meas.max(), pred.max())
        if np.isfinite(lo) and hi > 0:
            ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured (µs)")
        ax.set_ylabel("predicted (µs)")
        mape = report.compute_mape if kind == "compute" else report.collective_mape
        legend = " (○ fwd/step, △ bwd)" if kind == "compute" else ""
        ax.set_title(f"{kind}: hold-out, MAPE {100 * (mape or 0):.1f} %{legend}")
        ax.legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
