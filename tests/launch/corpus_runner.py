"""Run one corpus case (tests/launch/data/corpus/NN_name/) and compare with its expected.json."""
from __future__ import annotations

import json
import pathlib

from slurm_plugin.launch import ParsedScript, SlurmRequest, parse_script
from slurm_plugin.launch.files import default_read_file

CORPUS = pathlib.Path(__file__).parent / "data" / "corpus"


def cases() -> list[pathlib.Path]:
    return sorted(p for p in CORPUS.iterdir() if (p / "expected.json").exists())


def run_case(case: pathlib.Path) -> tuple[ParsedScript, dict]:
    exp = json.loads((case / "expected.json").read_text())
    params = exp.get("params", {})
    deny = set(params.get("deny", []))

    def reader(path: str) -> bytes:
        if pathlib.Path(path).name in deny:
            raise PermissionError(13, "Permission denied")
        return default_read_file(path)

    req = SlurmRequest(**params["request"]) if "request" in params else None
    res = parse_script(str(case / "job.sbatch"), request=req, read_file=reader, env=params.get("env"),
                       default_gpus_per_node=params.get("default_gpus_per_node"), work_dir=str(case),
                       deadline_s=10.0)   # no wall-clock flakiness on a busy CI machine
    return res, exp


def compare(res: ParsedScript, exp: dict) -> list[str]:
    """Field-by-field differences (empty = as expected)."""
    diffs: list[str] = []
    if exp.get("error"):
        if not res.error or exp["error"] not in res.error:
            diffs.append(f"error: want substring {exp['error']!r}, got {res.error!r}")
        if res.error and not res.error.startswith("cannot predict: "):
            diffs.append(f"error does not start with 'cannot predict: ': {res.error!r}")
        if res.error and "\n" in res.error:
            diffs.append("error is more than one line")
    elif res.error:
        diffs.append(f"unexpected error {res.error!r}")
    if "framework" in exp and res.framework != exp["framework"]:
        diffs.append(f"framework: want {exp['framework']}, got {res.framework}")
    for k, v in exp.get("request", {}).items():
        got = getattr(res.request, k)
        if got != v:
            diffs.append(f"request.{k}: want {v!r}, got {got!r}")
    want_job = exp.get("job")
    if want_job is not None:
        if res.job is None:
            diffs.append("job: want a TrainingJob, got None")
        else:
            jd = res.job.to_dict()
            for sec, keys in want_job.items():
                for k, v in keys.items():
                    if jd[sec].get(k) != v:
                        diffs.append(f"job.{sec}.{k}: want {v!r}, got {jd[sec].get(k)!r}")
    for k, v in exp.get("provenance", {}).items():
        got = res.provenance.get(k)
        if got is None or not got.endswith(v):
            diffs.append(f"provenance[{k}]: want …{v!r}, got {got!r}")
    if "unresolved" in exp and sorted(res.unresolved) != sorted(exp["unresolved"]):
        diffs.append(f"unresolved: want {exp['unresolved']}, got {res.unresolved}")
    for sub in exp.get("warnings", []):
        if not any(sub in w for w in res.warnings):
            diffs.append(f"warnings: none contains {sub!r}; got {res.warnings}")
    if "exit_duration_minutes" in exp and res.exit_duration_minutes != exp["exit_duration_minutes"]:
        diffs.append(f"exit_duration_minutes: want {exp['exit_duration_minutes']}, got {res.exit_duration_minutes}")
    return diffs
