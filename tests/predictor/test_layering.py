"""The layering docs/architecture.md describes: slurm_plugin -> predictor <- calibrate, predictor
importing none of torch, Slurm or the fitting libraries, no import cycle inside predictor, and
calibrate reaching slurm_plugin only through the modules named there.  Read from the source (every
import statement, in functions and TYPE_CHECKING blocks too), so nothing needs to be installed."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What predictor/ must never import (the daemon imports it next to slurmctld; it must import fast).
FORBIDDEN_IN_PREDICTOR = {"torch", "sklearn", "xgboost", "lightgbm", "scipy", "pandas", "slurm_plugin",
                          "calibrate", "benchmarks", "scripts"}
# calibrate's doors into slurm_plugin: the prediction records, the Slurm client, the site
# configuration both read, and the policy's duration syntax and watch rules.
CALIBRATE_MAY_USE = {"slurm_plugin.records", "slurm_plugin.slurm_client", "slurm_plugin.siteconfig",
                     "slurm_plugin.policy"}


def _imports(path: Path, package: str) -> list[tuple[str, int]]:
    """(absolute module name, line) of every import in one file of ``package``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = path.relative_to(ROOT).with_suffix("").parts[:-node.level]
                base = ".".join(parts)
                if node.module:
                    out.append((f"{base}.{node.module}", node.lineno))
                else:
                    out += [(f"{base}.{a.name}", node.lineno) for a in node.names]
            else:
                out.append((node.module or "", node.lineno))
    return out


def _py_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_predictor_imports_no_torch_slurm_or_fitting_library():
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}" for p in _py_files("predictor")
           for name, line in _imports(p, "predictor") if name.split(".")[0] in FORBIDDEN_IN_PREDICTOR]
    assert not bad, bad


def test_no_import_cycle_inside_predictor():
    modules = {p.stem for p in (ROOT / "predictor").glob("*.py")} - {"__init__"}
    edges = {m: set() for m in modules}
    for m in modules:
        for name, _ in _imports(ROOT / "predictor" / f"{m}.py", "predictor"):
            parts = name.split(".")
            if parts[0] == "predictor" and len(parts) > 1 and parts[1] in modules and parts[1] != m:
                edges[m].add(parts[1])
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        for n in sorted(edges[m]):
            if n in path:
                cycles.append(path[path.index(n):] + [n])
            elif n not in done:
                visit(n, path + [n])
        done.add(m)

    for m in sorted(modules):
        if m not in done:
            visit(m, [m])
    assert not cycles, cycles


def test_calibrate_reaches_slurm_plugin_only_through_the_named_modules():
    used = {name for p in _py_files("calibrate") for name, _ in _imports(p, "calibrate")
            if name.startswith("slurm_plugin")}
    assert used, "calibrate reads prediction records from slurm_plugin: the check would be vacuous"
    assert used <= CALIBRATE_MAY_USE, sorted(used - CALIBRATE_MAY_USE)
