"""perf-advise on the command line, with the fake predictor injected where a bundle would be."""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_plugin import cli_advise

from tests.predictor.advise_fakes import FakePlatform, FakePredictMany

REPO = Path(__file__).resolve().parents[2]

JOB_TOML = """
[model]
layers = 44
hidden = 6144
heads = 64
seq_len = 2048
parallel_residual = true

[layout]
pp = 4
tp = 4
dp = 8
micro_batch = 4
micro_batches = 8
zero_stage = 1
recompute = "full"

[run]
precision = "fp16"
train_iters = 2000

[cluster]
gpus_per_node = 4
"""


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    p = tmp_path / "gpt20b.toml"
    p.write_text(JOB_TOML)
    return p


def run_cli(argv, capsys, platform=None):
    code = cli_advise.run([str(a) for a in argv], predict_many=FakePredictMany(),
                          platform=platform or FakePlatform())
    out = capsys.readouterr()
    return code, out.out, out.err


def test_table_output(job_file, capsys):
    code, out, _ = run_cli([job_file, "--top", "5"], capsys)
    assert code == 0
    assert "PP-TP-DP" in out and "s/iteration" in out and "MFU" in out
    assert "your layout 4-4-8" in out
    assert "GPU-hours over 2,000 iterations" in out or "best layout found" in out


def test_json_output(job_file, capsys):
    code, out, _ = run_cli([job_file, "--json", "--top", "3"], capsys)
    d = json.loads(out)
    assert len(d["candidates"]) == 3
    assert d["current"]["rank"] >= 1
    assert d["candidates"][0]["iteration_seconds"] <= d["candidates"][1]["iteration_seconds"]


def test_csv_output(job_file, capsys):
    code, out, _ = run_cli([job_file, "--csv", "--gpus", "64", "--top", "7"], capsys)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 7 and rows[0]["rank"] == "1"
    assert {int(r["pp"]) * int(r["tp"]) * int(r["dp"]) for r in rows} == {64}


def test_sweep_table_json_and_plot(job_file, tmp_path, capsys):
    png = tmp_path / "sweep.png"
    code, out, _ = run_cli([job_file, "--gpus", "64,128,256", "--plot", png], capsys)
    assert code == 0
    assert "time to train" in out and "GPU-hours" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, out, _ = run_cli([job_file, "--nodes", "16,32", "--json"], capsys)
    d = json.loads(out)
    assert [p["gpus"] for p in d["sweep"]] == [64, 128]
    assert all(p["gpu_hours"] > 0 for p in d["sweep"])


def test_single_count_plot(job_file, tmp_path, capsys):
    png = tmp_path / "top.png"
    code, _, _ = run_cli([job_file, "--top", "6", "--plot", png], capsys)
    assert code == 0 and png.stat().st_size > 1000


def test_pin_and_all(job_file, capsys):
    code, out, _ = run_cli([job_file, "--json", "--pin", "micro_batch,recompute", "--all"], capsys)
    d = json.loads(out)
    assert {(c["micro_batch"], c["recompute"]) for c in d["candidates"]} == {(4, "full")}
    assert any(not c["fits"] for c in d["candidates"]) or all(c["fits"] for c in d["candidates"])


# --------------------------------------------------------------------------- bad input
def one_line_error(argv, capsys, monkeypatch=None):
    code = cli_advise.main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("perf-advise: ")
    assert "Traceback" not in err
    return lines[0]


def test_missing_job_file(tmp_path, capsys):
    line = one_line_error([tmp_path / "nope.toml"], capsys)
    assert "nope.toml" in line


def test_unknown_platform(job_file, capsys):
    line = one_line_error([job_file, "--platform", "no-such-platform"], capsys)
    assert "no-such-platform" in line


def test_bad_gpu_list(job_file, capsys):
    line = one_line_error([job_file, "--gpus", "64,abc"], capsys)
    assert "64,abc" in line


def test_gpus_and_nodes_exclusive(job_file, capsys):
    one_line_error([job_file, "--gpus", "64", "--nodes", "16"], capsys)


@pytest.fixture
def fake_platforms(monkeypatch):
    """Any --platform name loads the fake: these tests are about the CLI, not bundles."""
    import predictor.platform
    monkeypatch.setattr(predictor.platform, "load_platform", lambda name: FakePlatform())


def test_bad_job_key(tmp_path, capsys, fake_platforms):
    p = tmp_path / "bad.toml"
    p.write_text(JOB_TOML.replace("heads = 64", "heads = 60"))
    line = one_line_error([p, "--platform", "perlmutter-a100"], capsys)
    assert "model.heads" in line or "layout.tp" in line


def test_no_platform(job_file, capsys):
    line = one_line_error([job_file], capsys)
    assert "--platform" in line


def test_partition_without_site_config(job_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PERFCAST_CONFIG", str(tmp_path / "absent.toml"))
    line = one_line_error([job_file, "--partition", "gpu"], capsys)
    assert "site config" in line and "absent.toml" in line


def test_partition_maps_to_platform(job_file, tmp_path, monkeypatch, capsys):
    cfg = tmp_path / "perfcast.toml"
    cfg.write_text('[partitions.gpu]\nplatform = "fake-a100"\n')
    monkeypatch.setenv("PERFCAST_CONFIG", str(cfg))
    asked = []

    def fake_load(name):
        asked.append(name)
        return FakePlatform()

    import predictor.platform
    monkeypatch.setattr(predictor.platform, "load_platform", fake_load)
    code = cli_advise.run([str(job_file), "--partition", "gpu", "--json"], predict_many=FakePredictMany())
    assert code == 0 and asked == ["fake-a100"]
    capsys.readouterr()
    line = one_line_error([job_file, "--partition", "debug"], capsys)
    assert "'debug'" in line and "gpu" in line


def test_gpus_not_filling_nodes(job_file, capsys, fake_platforms):
    line = one_line_error([job_file, "--platform", "fake", "--gpus", "130"], capsys)
    assert "whole nodes" in line


def test_console_entry_point_runs_as_module(job_file):
    # The real entry point, in a fresh interpreter: one line and exit 2 on a bad --top.
    r = subprocess.run([sys.executable, "-m", "slurm_plugin.cli_advise", str(job_file), "--top", "0"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.startswith("perf-advise: ") and len(r.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- batch scripts
class _Parsed:
    def __init__(self, job=None, error=None):
        self.job, self.error = job, error


def test_batch_script_goes_through_parse_script(job_file, tmp_path, monkeypatch, capsys,
                                                fake_platforms):
    import slurm_plugin.launch as launch
    from predictor import TrainingJob
    script = tmp_path / "train.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -N 32\nsrun python train.py\n")
    seen = []

    def fake_parse(path, **kwargs):
        seen.append(str(path))
        return _Parsed(job=TrainingJob.from_toml(job_file))

    monkeypatch.setattr(launch, "parse_script", fake_parse, raising=False)
    code, out, _ = run_cli([script, "--json", "--top", "1"], capsys)
    assert code == 0 and seen == [str(script)]
    assert json.loads(out)["current"]["pp"] == 4

    monkeypatch.setattr(launch, "parse_script", lambda p, **kw: _Parsed(error="no launch line found"),
                        raising=False)
    line = one_line_error([script, "--platform", "perlmutter-a100"], capsys)
    assert "no launch line found" in line and "train.sbatch" in line


def test_real_batch_script(tmp_path, capsys):
    """A GPT-NeoX launch through the real script parser (skipped where it is not built)."""
    pytest.importorskip("slurm_plugin.launch")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "small.yml").write_text(
        '{"pipe_parallel_size": 2, "model_parallel_size": 2, "num_layers": 24, "hidden_size": 2048,\n'
        ' "num_attention_heads": 16, "seq_length": 2048, "max_position_embeddings": 2048,\n'
        ' "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8,\n'
        ' "zero_optimization": {"stage": 1}, "checkpoint_activations": true,\n'
        ' "fp16": {"enabled": true}, "train_iters": 5000}\n')
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gres=gpu:4\n"
                      f"cd {tmp_path}\npython ./deepy.py train.py -d configs small.yml\n")
    code = cli_advise.run([str(script), "--json", "--top", "3"], predict_many=FakePredictMany(),
                          platform=FakePlatform())
    d = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (d["current"]["pp"], d["current"]["tp"], d["current"]["dp"]) == (2, 2, 2)
    assert d["global_batch"] == 4 * 8 * 2 and d["iterations"] == 5000


def test_counts_add_up_and_ruled_out_is_apart(job_file, capsys):
    code, out, _ = run_cli([job_file, "--gpus", "128", "--json"], capsys)
    d = json.loads(out)
    fit = sum(1 for c in d["candidates"] if c["fits"])   # --top 10 cuts the list: count from the text
    code, text, _ = run_cli([job_file, "--gpus", "128"], capsys)
    line = next(ln for ln in text.splitlines() if "meet the launch constraints" in ln)
    head, _, rest = line.partition(" meet the launch constraints: ")
    enumerated = int(head.split()[0].replace(",", ""))
    numbers = [int(part.split()[0].replace(",", "")) for part in rest.split("; ")]
    assert enumerated == sum(numbers) == d["enumerated"], line
    assert numbers[0] >= fit and enumerated == numbers[0] + sum(d["dropped"].values())
    assert all(why not in d["dropped"] for why in d["ruled_out"])
    ruled = [ln for ln in text.splitlines() if ln.startswith("ruled out before")]
    assert bool(ruled) == bool(d["ruled_out"])


def test_plain_words_for_the_own_layout(job_file, capsys):
    job_file.write_text(JOB_TOML.replace('recompute = "full"', 'recompute = "none"'))
    _, out, _ = run_cli([job_file, "--all"], capsys)
    assert "with none recompute" not in out and "none recompute" not in out
    assert "no recompute" in out


def test_node_filling_is_one_rule(job_file, capsys):
    """Part of one node, whole nodes, or nodes with the same number each (sbatch --nodes N
    --gpus-per-node G): 3 and 6 GPUs on 4-GPU nodes are accepted, 7 is not."""
    from predictor.advise import AdviseError, gpus_per_node_used
    assert gpus_per_node_used(3, 4) == 4 and gpus_per_node_used(8, 4) == 4
    assert gpus_per_node_used(6, 4) == 3 and gpus_per_node_used(12, 8) == 6
    with pytest.raises(AdviseError, match="spread evenly over 2 nodes"):
        gpus_per_node_used(7, 4)
    code, out, _ = run_cli([job_file, "--gpus", "96"], capsys)
    assert code == 0 and "(24 nodes of 4)" in out


def test_plot_without_matplotlib_keeps_the_answer(job_file, tmp_path, capsys, monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    png = tmp_path / "chart.png"
    code, out, err = run_cli([job_file, "--plot", png], capsys)
    assert code == 0 and "s/iteration" in out and not png.exists()
    assert "--plot needs matplotlib" in err and "no chart written" in err


def test_partition_of_a_batch_script_picks_the_platform(tmp_path, capsys, monkeypatch):
    """perf-advise, like perf-predict and sbatch: #SBATCH --partition -> the site config's platform."""
    import re
    import shutil
    corpus = REPO / "tests" / "launch" / "data" / "corpus" / "01_neox_20b"
    shutil.copytree(corpus, tmp_path / "job")
    script = tmp_path / "job" / "job.sbatch"
    script.write_text(re.sub(r"#SBATCH (-p|--partition)[ =]\S+", "#SBATCH --partition=h100", script.read_text()))
    cfg = tmp_path / "perfcast.toml"
    cfg.write_text('[partitions.h100]\nplatform = "dgx-h100"\n')
    monkeypatch.setenv("PERFCAST_CONFIG", str(cfg))
    monkeypatch.delenv("SBATCH_PARTITION", raising=False)
    code = cli_advise.run([str(script), "--json", "--top", "2"], predict_many=FakePredictMany())
    got = capsys.readouterr()
    assert code == 0 and json.loads(got.out)["platform"] == "dgx-h100"
    assert "platform dgx-h100 for partition h100" in got.err


@pytest.mark.parametrize("name, needle", [
    ("chart.txt", "must end in one of .png"),
    ("chart", "must end in one of .png"),     # matplotlib would write chart.png, unsaid
    (".", "is a directory"),
])
def test_a_plot_name_matplotlib_would_refuse_or_rename_is_refused_first(job_file, tmp_path, capsys, name, needle):
    target = tmp_path if name == "." else tmp_path / name
    line = one_line_error([job_file, "--plot", target], capsys)
    assert needle in line
    assert not list(tmp_path.glob("*.png")) and not (tmp_path.parent / f"{tmp_path.name}.png").exists()


def test_a_count_left_out_of_the_list_is_refused(job_file, capsys):
    assert "64,,128" in one_line_error([job_file, "--gpus", "64,,128"], capsys)
    assert "64," in one_line_error([job_file, "--gpus", "64,"], capsys)


def test_no_layout_for_a_pinned_cp_says_why_not_memory(job_file, capsys):
    """--cp 3 on 128 GPUs: nothing can launch; the note used to blame memory."""
    code, out, _ = run_cli([job_file, "--gpus", "128", "--cp", "3", "--json"], capsys)
    d = json.loads(out)
    assert d["enumerated"] == 0 and d["ruled_out"] == {"cp 3 does not divide 128 GPUs": 1}
    assert any("meets the constraints (cp 3 does not divide 128 GPUs)" in n for n in d["notes"])
    assert not any("fits in" in n for n in d["notes"])


def test_a_layout_with_nothing_to_compare_is_not_called_the_best(job_file, capsys):
    """--cp 3 over 128 GPUs rules every searched layout out: the user's own is ranked alone."""
    code, out, _ = run_cli([job_file, "--gpus", "128", "--cp", "3"], capsys)
    assert code == 0 and "cp 3 does not divide 128 GPUs" in out
    assert "ranks 1 of 1" in out and "no other layout to compare it with" in out
    assert "best layout found" not in out


def test_json_error_is_a_json_object_on_stdout(job_file, capsys):
    assert cli_advise.main([str(job_file), "--platform", "no-such-platform", "--json"]) == 2
    cap = capsys.readouterr()
    err = json.loads(cap.out)["error"]
    assert err["type"] == "platform_not_found" and "no-such-platform" in err["message"]
    assert cap.err.strip() == f"perf-advise: {err['message']}"
