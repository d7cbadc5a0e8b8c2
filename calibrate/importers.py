"""Importers of third-party measurements into perfcast's sample store (no torch needed).

``estimate-train-time``: the measured samples published with Zhang et al. (arXiv:2509.22832,
MIT licence).  Their CSVs give each operator by the *model* configuration it was sampled at
(mp, b, h, l, dim); we convert every row to the physical shape of :mod:`predictor.operators`
(GEMM m/k/n, attention batch/l/d, …) so their samples and ours fit through one path.
"""
from __future__ import annotations

import csv
import io
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from predictor.errors import PerfcastError
from predictor.recipe import vocab_per_rank
from predictor.samples import collective_columns, operator_columns

from .store import append_rows, write_meta

log = logging.getLogger(__name__)

# The vocabulary their kernels were sampled with (GPT-2 BPE), padded per tensor-parallel rank to a
# multiple of 128 as GPT-NeoX does (make_vocab_size_divisible_by = 128).
PAPER_VOCAB = 50257


class ImportError_(PerfcastError):
    """Source data that cannot be imported (missing folder, unknown layout, bad row)."""


def _layer_params(dim: float, mp: float) -> float:
    """Parameters of one GPT-NeoX layer held by one tensor-parallel rank *as the paper's code
    counted them* when it measured its optimizer samples (Eq. 6 of the paper): every bias split
    with its linear.  Reading their samples needs their definition, not the recipe's (which keeps
    row-parallel biases whole, as Megatron does): the difference is 2·dim per layer.
    """
    norms = 2 * (2 * dim)
    linears = 3 * dim * (dim + 1) + dim * (dim + 1) + 4 * dim * (dim + 1) + dim * (4 * dim + 1)
    return norms + linears / mp


Row = dict[str, float]
# (their file suffix, our operator, conversion of one of their rows to our features)
_Convert = Callable[[Row], dict[str, float]]


def _gemm(k: Callable[[Row], float], n: Callable[[Row], float]) -> _Convert:
    return lambda r: {"m": r["b"] * r["l"], "k": k(r), "n": n(r)}


def _attn(r: Row) -> dict[str, float]:
    return {"batch": r["b"] * r["h"] / r["mp"], "l": r["l"], "d": r["dim"] / r["h"]}


_OPERATORS: list[tuple[str, str, _Convert]] = [
    ("linear1", "linear1", _gemm(lambda r: r["dim"], lambda r: 3 * r["dim"] / r["mp"])),
    ("linear2", "linear2", _gemm(lambda r: r["dim"] / r["mp"], lambda r: r["dim"])),
    ("linear3", "linear3", _gemm(lambda r: r["dim"], lambda r: 4 * r["dim"] / r["mp"])),
    ("linear4", "linear4", _gemm(lambda r: 4 * r["dim"] / r["mp"], lambda r: r["dim"])),
    ("linear_final", "linear_final",
     _gemm(lambda r: r["dim"], lambda r: vocab_per_rank(PAPER_VOCAB, int(r["mp"])))),
    ("baddbmm", "baddbmm", _attn),
    ("bmm", "bmm", _attn),
    ("fillmask", "fillmask", _attn),
    ("softmax", "softmax", lambda r: {"batch": r["b"] * r["h"] / r["mp"], "l": r["l"]}),
    ("ScaledUpperTriangMaskedSoftmax", "scaled_masked_softmax",
     lambda r: {"batch": r["b"] * r["h"] / r["mp"], "l": r["l"]}),
    ("flash_atten", "flash_atten",
     lambda r: {"b": r["b"], "heads": r["h"] / r["mp"], "l": r["l"], "d": r["dim"] / r["h"]}),
    ("RoPE", "rope", lambda r: {"tokens": r["b"] * r["l"], "heads": r["h"] / r["mp"], "d": r["dim"] / r["h"]}),
    ("gelu", "gelu", lambda r: {"tokens": r["b"] * r["l"], "width": 4 * r["dim"] / r["mp"]}),
    ("layernorm", "layernorm", lambda r: {"tokens": r["b"] * r["l"], "dim": r["dim"]}),
    ("RMSlayernorm", "rmsnorm", lambda r: {"tokens": r["b"] * r["l"], "dim": r["dim"]}),
    ("res_add", "res_add", lambda r: {"tokens": r["b"] * r["l"], "dim": r["dim"]}),
    ("embedding", "embedding", lambda r: {"tokens": r["b"] * r["l"], "dim": r["dim"],
                                          "vocab": vocab_per_rank(PAPER_VOCAB, int(r["mp"]))}),
    ("parallel_cross_entropy_128", "cross_entropy",
     lambda r: {"tokens": r["b"] * r["l"], "vocab": vocab_per_rank(PAPER_VOCAB, int(r["mp"]))}),
]


def _stage_params(kind: str) -> Callable[[Row], dict[str, float]]:
    """Their optimizer samples give (mp, dim, layers of the stage); we cost by parameters updated."""

    def convert(r: Row) -> dict[str, float]:
        params = r["encoders"] * _layer_params(r["dim"], r["mp"])
        vocab = vocab_per_rank(PAPER_VOCAB, int(r["mp"]))
        if kind == "firstStage":
            params += vocab * r["dim"]
        elif kind == "lastStage":
            params += vocab * r["dim"] + 2 * r["dim"]
        return {"params": params}
    return convert


@dataclass
class ImportSummary:
    out_dir: Path
    gpu: str
    operator_rows: dict[str, int]
    collective_rows: dict[str, int]
    skipped_files: list[str]
    dropped_rows: dict[str, int] = field(default_factory=dict)


# No GPU link moves more than this per rank (NVLink4 is 900 GB/s both directions together); a row
# implying more is a failed or skipped measurement (Vista's 8-node all-gathers of 0.5 GB "in" 118 µs).
MAX_RANK_GBPS = 1000.0


def _impossible(kind: str, entries: float, ranks: float, us: float) -> bool:
    per_rank = {"allreduce": 2 * (ranks - 1) / ranks * entries, "allgather": (ranks - 1) * entries,
                "p2p": entries}[kind] * 2.0
    return us <= 0 or per_rank / (us * 1e-6) > MAX_RANK_GBPS * 1e9


_TOPO = re.compile(r"^(?P<gpu>.+?)_(?P<coll>allreduce_large|allreduce|allgather_large|p2p)_(?P<prec>fp16|bf16|fp32)"
                   r"_(?P<nodes>\d+)_(?P<gpn>\d+)\.csv$")
_COLLECTIVE_KIND = {"allreduce": "allreduce", "allreduce_large": "allreduce",
                    "allgather_large": "allgather", "p2p": "p2p"}


def import_estimate_train_time(src: "str | Path", out_dir: "str | Path", *, gpu: str | None = None,
                               overwrite: bool = False) -> ImportSummary:
    """Convert one system's folder (``<src>/operator``, ``<src>/nccl``) into a sample directory.

    ``src`` is e.g. the ``Perlmutter`` folder of the estimate-train-time data.  Per-topology collective files
    are used; the pooled files without a topology suffix repeat them and are skipped.
    """
    src, out = Path(src), Path(out_dir)
    op_dir, nccl_dir = src / "operator", src / "nccl"
    if not op_dir.is_dir():
        raise ImportError_(f"{src}: no operator/ folder (expected an estimate-train-time system folder)")
    if out.exists() and not overwrite:
        raise ImportError_(f"{out}: already exists (pass overwrite=True / --force to replace it)")
    gpu_name = gpu or _detect_gpu(op_dir)
    # Written into a sibling and renamed at the end: a source file that turns out malformed
    # halfway leaves no partial --out behind (nor removes the one --force was to replace).
    tmp = out.parent / f".{out.name}.importing-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        summary = _import_into(src, op_dir, nccl_dir, tmp, gpu_name)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    summary.out_dir = out
    return summary


def _import_into(src: Path, op_dir: Path, nccl_dir: Path, out: Path, gpu_name: str) -> ImportSummary:
    summary = ImportSummary(out, gpu_name, {}, {}, [])

    for their, ours, convert in _OPERATORS:
        path = op_dir / f"{gpu_name}_{their}_fp16.csv"
        if not path.is_file():
            log.warning("%s: missing, operator %s not imported", path, ours)
            continue
        rows = _convert_rows(path, convert, ours, ("F_dur(us)", "B_dur(us)"))
        dropped = _drop_implausible_backward(ours, rows)
        if dropped:
            summary.dropped_rows[f"{ours} backward"] = dropped
        summary.operator_rows[ours] = append_rows(out / "operators" / f"{ours}_fp16.csv",
                                                  operator_columns(ours), rows)
    opt_rows: list[list[float]] = []
    for stage in ("firstStage", "middleStage", "lastStage"):
        path = op_dir / f"{gpu_name}_{stage}_optimizer_fp16.csv"
        if path.is_file():
            opt_rows.extend(_convert_rows(path, _stage_params(stage), "optimizer", ("dur(us)",)))
    if opt_rows:
        summary.operator_rows["optimizer"] = append_rows(out / "operators" / "optimizer_fp16.csv",
                                                         operator_columns("optimizer"), opt_rows)
    if (op_dir / f"{gpu_name}_optimizer_fp16.csv").is_file():
        # A whole-model, unfused optimizer measurement that disagrees with the per-stage files by
        # an order of magnitude; the paper's own estimator does not use it either.
        summary.skipped_files.append(f"{gpu_name}_optimizer_fp16.csv")

    per_kind: dict[str, list[list[float]]] = {}
    for path in sorted(nccl_dir.glob("*.csv")) if nccl_dir.is_dir() else []:
        m = _TOPO.match(path.name)
        if not m:
            if path.name != f"{gpu_name}.csv":
                summary.skipped_files.append(path.name)
            continue
        kind = _COLLECTIVE_KIND[m["coll"]]
        nodes, gpn = float(m["nodes"]), float(m["gpn"])
        for _, r in _read_csv(path, ("shape", "dur(us)")):
            if _impossible(kind, r["shape"], nodes * gpn, r["dur(us)"]):
                summary.dropped_rows[kind] = summary.dropped_rows.get(kind, 0) + 1
                continue
            per_kind.setdefault(kind, []).append([r["shape"], nodes, gpn, r["dur(us)"]])
    for kind, rows in per_kind.items():
        summary.collective_rows[kind] = append_rows(out / "collectives" / f"{kind}_fp16.csv",
                                                    collective_columns(), rows)

    write_meta(out, {
        "gpu": gpu_name,
        "source": "estimate-train-time",
        "source_path": str(src),
        "device": "cuda",
        "precisions": ["fp16"],
        "license": "MIT (c) the estimate-train-time authors; see LICENSE beside these samples",
        "citation": "Zhang et al., Efficient Fine-Grained GPU Performance Modeling for Distributed "
                    "Deep Learning of LLM, arXiv:2509.22832 (HiPC 2025)",
        "skipped_files": summary.skipped_files,
        "dropped_rows": ", ".join(f"{k}: {v}" for k, v in sorted(summary.dropped_rows.items()))
                        + f" (collectives: implied more than {MAX_RANK_GBPS:.0f} GB/s per rank; "
                        "backward: faster than the forward, impossible for that operator)",
    })
    lic = src.parent / "LICENSE"
    if lic.is_file():
        shutil.copyfile(lic, out / "LICENSE")
    return summary


# Flash attention's backward recomputes the forward's scores and does 2.5x its FLOPs: a backward
# measured faster than its forward missed kernels.  (Vista's file has that in 97 % of its rows, with
# backward times that do not grow with the work: the whole column is a failed measurement there.)
MIN_BACKWARD_OVER_FORWARD = {"flash_atten": 1.0}


def _drop_implausible_backward(op: str, rows: list[list[float]]) -> int:
    """Mark impossible backward times as not measured (0); all of them when most are impossible.

    Returns how many backward values were dropped.  The forward values stay.
    """
    floor = MIN_BACKWARD_OVER_FORWARD.get(op)
    if floor is None or not rows:
        return 0
    bad = [r for r in rows if r[-1] < floor * r[-2]]
    if not bad:
        return 0
    victims = rows if len(bad) > len(rows) / 2 else bad
    for r in victims:
        r[-1] = 0.0
    log.warning("%s: %d of %d backward times are below %.1fx the forward (impossible); "
                "%s backward dropped", op, len(bad), len(rows), floor,
                "the whole" if victims is rows else "those")
    return len(victims)


def _detect_gpu(op_dir: Path) -> str:
    names = sorted(p.stem for p in op_dir.glob("*.csv") if "_" not in p.stem)
    if len(names) != 1:
        raise ImportError_(f"{op_dir}: cannot tell the GPU name (found {names or 'no'} summary files)")
    return names[0]


def _read_csv(path: Path, required: Iterable[str] = ()) -> Iterable[tuple[int, Row]]:
    """(line number, row of numbers) of one of their CSVs; a malformed file is one ImportError_
    naming the file and the line (and the column where there is one)."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ImportError_(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); "
                           "expected a CSV of numbers") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = [h.strip() for h in reader.fieldnames or ()]
    missing = [c for c in required if c not in header]
    if missing:
        raise ImportError_(f"{path}:1: no column {', '.join(map(repr, missing))} in the header "
                           f"({', '.join(header) or 'empty'})")
    for raw in reader:
        lineno = reader.line_num
        if None in raw:
            raise ImportError_(f"{path}:{lineno}: more values than the header has columns")
        row: Row = {}
        for k, v in raw.items():
            if v is None:
                raise ImportError_(f"{path}:{lineno}: fewer values than the header has columns")
            try:
                row[k.strip()] = float(v)
            except ValueError:
                raise ImportError_(f"{path}:{lineno}: column {k.strip()!r}: {v!r} is not a number") from None
        yield lineno, row


# Their model configuration columns: each must be a positive number (mp is the tensor-parallel
# size, a whole number of ranks; a 0 would divide by zero in the conversion).
_POSITIVE = ("mp", "b", "h", "l", "dim")


def _convert_rows(path: Path, convert: _Convert, op: str, durations: tuple[str, ...]) -> list[list[float]]:
    columns = operator_columns(op)
    features = columns[: len(columns) - len(durations)]
    out = []
    for lineno, r in _read_csv(path, durations):
        for c in _POSITIVE:
            if c in r and not (np.isfinite(r[c]) and r[c] > 0 and (c != "mp" or r[c] == int(r[c]))):
                raise ImportError_(f"{path}:{lineno}: column {c!r} is {r[c]:g}; expected "
                                   + ("a whole number of ranks, 1 or more" if c == "mp" else "a positive number"))
        try:
            shape = convert(r)
        except KeyError as exc:
            raise ImportError_(f"{path}:1: no column {exc.args[0]!r} in the header "
                               f"({', '.join(r)}); operator {op} needs it") from None
        except (ZeroDivisionError, ValueError, OverflowError) as exc:
            raise ImportError_(f"{path}:{lineno}: cannot convert this row to {op}'s shape ({exc})") from None
        durs = [r[d] for d in durations]
        if not all(np.isfinite(durs)) or min(durs) <= 0:
            continue
        out.append([shape[f] for f in features] + durs)
    return out
