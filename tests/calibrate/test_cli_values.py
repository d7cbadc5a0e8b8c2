"""perf-calibrate refuses wrong values at parsing: one line naming the flag, exit code 2, no
traceback and no work done (QA findings 4 and 5)."""
from __future__ import annotations

import pytest

from calibrate.cli import build_parser, main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _refused(capsys, argv, *words):
    code, out, err = _run(capsys, *argv)
    assert code == 2, (argv, out, err)
    assert err.startswith("perf-calibrate: ") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in err, (w, err)
    return err


@pytest.mark.parametrize("flag,value", [("--threads", "-2"), ("--threads", "0"), ("--ranks", "0"),
                                        ("--ranks", "-1"), ("--threads", "two")])
def test_run_refuses_ranks_and_threads_below_one(capsys, tmp_path, flag, value):
    # --threads -2 used to reach torch.set_num_threads (a RuntimeError traceback); 0 quietly meant
    # the default, which the help never said.
    _refused(capsys, ["run", "--plan", "tiny", "--out", str(tmp_path / "s"), flag, value], f"argument {flag}",
             repr(value))
    assert not (tmp_path / "s").exists()


def test_run_still_takes_counts_and_defaults():
    ap = build_parser()
    a = ap.parse_args(["run", "--out", "x", "--ranks", "4", "--threads", "3"])
    assert (a.ranks, a.threads) == (4, 3)
    a = ap.parse_args(["run", "--out", "x"])
    assert (a.ranks, a.threads) == (0, 0)       # the runner's defaults (2 on cpu; cores / ranks)


def test_run_refuses_budget_for_a_fixed_plan(capsys, tmp_path):
    # As `plan tiny --budget 5` is: docs/calibration.md says --budget is for the adaptive plan only.
    _refused(capsys, ["run", "--plan", "tiny", "--budget", "5", "--out", str(tmp_path / "s")],
             "--budget is for the adaptive plan only", "plan tiny")
    plan_file = tmp_path / "p.toml"
    plan_file.write_text('format = 1\nname = "p"\n[grid]\n', encoding="utf-8")
    _refused(capsys, ["run", "--plan", str(plan_file), "--budget", "5", "--out", str(tmp_path / "s")],
             "--budget", "the points its file lists")
    assert not (tmp_path / "s").exists()
    # The same words as `plan`'s refusal.
    err_plan = _refused(capsys, ["plan", "tiny", "--budget", "5"], "--budget")
    err_run = _refused(capsys, ["run", "--plan", "tiny", "--budget", "5", "--out", str(tmp_path / "s")])
    assert err_plan == err_run


@pytest.mark.parametrize("flag,value", [("--gpus-per-node", "0"), ("--gpus-per-node", "-1"),
                                        ("--nics-per-node", "-1"), ("--nics-per-node", "0")])
def test_fit_refuses_per_node_counts_below_one(capsys, tmp_path, flag, value):
    # --gpus-per-node 0 used to be replaced by the store's count without a word, -1 failed after the
    # fit naming a temporary platform.toml, --nics-per-node -1 was a ValueError traceback.
    (tmp_path / "s").mkdir()
    err = _refused(capsys, ["fit", str(tmp_path / "s"), "--out", str(tmp_path / "p"), flag, value],
                   f"argument {flag}", repr(value))
    assert ".fit" not in err
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("name", ["bad name/../x", "a/b", "..", "../x", "a..b", "x/", "with space", ""])
def test_fit_refuses_a_name_that_is_no_directory_name(capsys, tmp_path, name):
    (tmp_path / "s").mkdir()
    err = _refused(capsys, ["fit", str(tmp_path / "s"), "--out", str(tmp_path / "p"), "--name", name],
                   "argument --name", repr(name))
    assert "-compute" not in err            # the name as typed, not the bundle's internal one
    assert not (tmp_path / "p").exists()


def test_fit_takes_platform_names():
    ap = build_parser()
    for name in ("cpu", "cpu-tiny", "gpu_a100.v2", "H100x8"):
        assert ap.parse_args(["fit", "s", "--out", "p", "--name", name]).name == name
    a = ap.parse_args(["fit", "s", "--out", "p", "--gpus-per-node", "8", "--nics-per-node", "4"])
    assert (a.gpus_per_node, a.nics_per_node, a.name) == (8, 4, None)


@pytest.mark.parametrize("value", ["0", "-3"])
def test_fabric_refuses_ranks_below_one(capsys, tmp_path, value):
    # 0 used to mean the default without a word, as run's --ranks did.
    _refused(capsys, ["fabric", "--device", "cpu", "--out", str(tmp_path / "f.toml"), "--ranks", value],
             "argument --ranks", repr(value))
    assert not (tmp_path / "f.toml").exists()
