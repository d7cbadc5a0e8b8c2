from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from calibrate.cli import build_parser, main
from predictor.errors import UsageError


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_errors_are_one_line_exit_2(capsys, tmp_path):
    for argv in (["fit", str(tmp_path / "missing"), "--out", str(tmp_path / "p")],
                 ["rollback", "nopart", "--root", str(tmp_path)],
                 ["plan", "nope"],
                 ["run", "--plan", "tiny", "--device", "cuda", "--out", str(tmp_path / "s")],
                 ["import", "--format", "estimate-train-time", str(tmp_path / "nosrc"), "--out", str(tmp_path / "i")]):
        code, out, err = _run(capsys, *argv)
        assert code == 2, argv
        assert len(err.strip().splitlines()) == 1 and err.startswith("perf-calibrate: "), err
        assert "Traceback" not in err
    # A bad option is refused the same way: one line, exit code 2.
    code, _, err = _run(capsys, "run", "--precision", "fp4", "--out", str(tmp_path / "x"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "fp4" in err


def test_fit_refuses_a_corrupt_store(capsys, store_copy, tmp_path):
    f = store_copy / "operators" / "gelu_fp32.csv"
    f.write_text(f.read_text().replace(",", ";", 3))
    code, _, err = _run(capsys, "fit", str(store_copy), "--out", str(tmp_path / "p"))
    assert code == 2 and "gelu_fp32.csv" in err
    assert not (tmp_path / "p").exists()


def test_fit_refuses_unknown_gpu_of_foreign_samples(capsys, tmp_path):
    d = tmp_path / "s"
    (d / "operators").mkdir(parents=True)
    (d / "samples.toml").write_text('format = 1\ngpu = "Mystery X9"\n')
    (d / "operators" / "gelu_fp16.csv").write_text("tokens,width,fwd_us,bwd_us\n" +
                                                   "".join(f"{i},64,{i},{2 * i}\n" for i in range(1, 12)))
    code, _, err = _run(capsys, "fit", str(d), "--out", str(tmp_path / "p"))
    assert code == 2 and "Mystery X9" in err


def test_status_install_rollback_via_cli(capsys, tiny_platform, tmp_path):
    root = str(tmp_path / "root")
    code, out, _ = _run(capsys, "status", "--root", root)
    assert code == 0 and "no calibrated partitions" in out
    assert _run(capsys, "install", str(tiny_platform), "--partition", "cpu", "--root", root)[0] == 0
    # The same files again add no version; a changed copy does.
    code, out, _ = _run(capsys, "install", str(tiny_platform), "--partition", "cpu", "--root", root)
    assert code == 0 and "nothing changed" in out
    again = tmp_path / "again"
    shutil.copytree(tiny_platform, again)
    (again / "calibration.toml").write_text((again / "calibration.toml").read_text() + "# again\n")
    assert _run(capsys, "install", str(again), "--partition", "cpu", "--root", root)[0] == 0
    code, out, _ = _run(capsys, "status", "--root", root, "--json")
    rows = json.loads(out)
    assert code == 0 and rows[0]["partition"] == "cpu" and rows[0]["previous"]
    code, out, _ = _run(capsys, "status", "--root", root)
    assert "cpu" in out and "%" in out
    code, out, _ = _run(capsys, "rollback", "cpu", "--root", root)
    assert code == 0 and "rolled back" in out


def test_commands_other_than_run_do_not_import_torch(tmp_path):
    code = ("import sys\n"
            "from calibrate import cli\n"
            "rc = cli.main(['status', '--root', sys.argv[1]])\n"
            "rc2 = cli.main(['plan', 'smoke', '--device', 'cpu'])\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "sys.exit(rc or rc2)\n")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_schedule_dry_run_via_cli(capsys, tmp_path, monkeypatch):
    from tests.calibrate.test_schedule import FakeSlurm
    import slurm_plugin.slurm_client as sc
    monkeypatch.setattr(sc, "SlurmClient", lambda *a, **k: FakeSlurm())
    code, out, err = _run(capsys, "schedule", "--partition", "gpu", "--every", "30d", "--dry-run",
                          "--root", str(tmp_path))
    assert code == 0 and out.startswith("#!/bin/bash") and "GPU-minutes" in err
    assert not (tmp_path / "gpu").exists()


def test_run_resumes_a_finished_store_and_states_the_cost(capsys, store_copy):
    code, out, err = _run(capsys, "run", "--plan", "tiny", "--out", str(store_copy), "--no-progress")
    assert code == 0
    assert "0 operator and 0 collective points measured" in out and "complete" in out
    assert "estimated cost:" in err and "GPU-minutes" in err


def test_host_costs_via_cli(capsys, tmp_path):
    # The host side of every catalog operator, measured on this CPU, written as a [host] table
    # that build_platforms.py turns into a platform's host costs.
    pytest.importorskip("torch", reason="perf-calibrate host measures with torch")
    import tomllib

    from predictor.operators import CALIBRATED, OPERATORS
    out_file = tmp_path / "host.toml"
    code, out, err = _run(capsys, "host", "--device", "cpu", "--out", str(out_file))
    assert code == 0, err
    assert str(out_file) in out and "launch" in out
    host = tomllib.loads(out_file.read_text(encoding="utf-8"))["host"]
    assert host["device"] == "cpu" and host["precision"] == "fp32"
    assert set(host["operators"]) == set(CALIBRATED)
    for op, dirs in host["operators"].items():
        assert set(dirs) == set(OPERATORS[op].directions), op
        assert all(us > 0 for us in dirs.values()), op
    assert host["layer_us"] > 0 and host["layer_forward_us"] > 0


def test_cli_takes_fp8_for_run_but_not_for_host():
    ap = build_parser()
    assert ap.parse_args(["run", "--out", "x", "--precision", "fp16,fp8"]).precision == ("fp16", "fp8")
    with pytest.raises(UsageError, match=r"precisions are fp16, bf16, fp32 \(comma-separated\), got 'fp8'"):
        ap.parse_args(["host", "--out", "x", "--precision", "fp8"])


def test_json_commands_answer_errors_in_json(capsys, tmp_path):
    # A failing --json command: the one line on stderr as always, and one JSON object on stdout.
    code, out, err = _run(capsys, "report", "--records", str(tmp_path / "missing.sqlite"), "--json")
    assert code == 2 and err.startswith("perf-calibrate: ")
    doc = json.loads(out)["error"]
    assert doc["exit_code"] == 2 and doc["message"] in err
    code, out, err = _run(capsys, "status", "--rot", str(tmp_path), "--json")
    assert code == 2 and json.loads(out)["error"]["type"] == "usage_error"
    code, out, _ = _run(capsys, "report", "--records", str(tmp_path / "missing.sqlite"))
    assert code == 2 and out == ""
