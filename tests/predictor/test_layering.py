"""The layering docs/architecture.md describes: slurm_plugin -> predictor <- calibrate, predictor
importing none of torch, Slurm or the fitting libraries, no import cycle in any package, and
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
# configuration both read, the policy's duration syntax and watch rules, and the QOS/association
# MaxWall lookup the watch shares with the fill.
CALIBRATE_MAY_USE = {"slurm_plugin.records", "slurm_plugin.slurm_client", "slurm_plugin.siteconfig",
                     "slurm_plugin.policy", "slurm_plugin.qos_limits"}


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


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_cycle_in_any_package():
    """predictor, calibrate and slurm_plugin, function-level imports included: a cycle hidden by a
    lazy import is still a cycle (issue 33)."""
    files = {_module_name(p): p for pkg in ("predictor", "calibrate", "slurm_plugin")
             for p in _py_files(pkg)}
    # Compiled modules (predictor's optional C walk, built from its .c) are modules of their own.
    compiled = {".".join(p.relative_to(ROOT).parts[:-1] + (p.name.split(".")[0],))
                for pkg in ("predictor", "calibrate", "slurm_plugin") for p in (ROOT / pkg).rglob("*.c")}

    def module_of(name: str) -> str:
        """The module an imported name lives in: the longest prefix that is one of ours."""
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            prefix = ".".join(parts[:i])
            if prefix in files or prefix in compiled:
                return prefix
        return ""

    def imported(path: Path) -> list[str]:
        """Every name an import statement binds, as a dotted path (``from a import b``: a.b, which
        is module a.b where there is one, else a name of a)."""
        out = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = path.relative_to(ROOT).with_suffix("").parts[:-node.level]
                    base = ".".join(parts + ((node.module,) if node.module else ()))
                out += [f"{base}.{a.name}" for a in node.names]
        return out

    edges: dict[str, set[str]] = {m: set() for m in files}
    for m, path in files.items():
        for name in imported(path):
            target = module_of(name)
            if target in files and target != m:
                edges[m].add(target)
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(m: str, trail: list[str]) -> None:
        for n in sorted(edges[m]):
            if n in trail:
                cycles.append(trail[trail.index(n):] + [n])
            elif n not in done:
                visit(n, trail + [n])
        done.add(m)

    for m in sorted(files):
        if m not in done:
            visit(m, [m])
    assert not cycles, cycles


def test_calibrate_reaches_slurm_plugin_only_through_the_named_modules():
    used = {name for p in _py_files("calibrate") for name, _ in _imports(p, "calibrate")
            if name.startswith("slurm_plugin")}
    assert used, "calibrate reads prediction records from slurm_plugin: the check would be vacuous"
    assert used <= CALIBRATE_MAY_USE, sorted(used - CALIBRATE_MAY_USE)
