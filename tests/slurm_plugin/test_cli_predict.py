import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_plugin.cli_predict import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gpt20b-perlmutter.toml"


def test_human_table(capsys):
    assert main([str(EXAMPLE), "--platform", "perlmutter-a100"]) == 0
    out = capsys.readouterr().out
    assert "iteration" in out and "bubble" in out and "total" in out
    from predictor.results import Breakdown
    for name in Breakdown.PARTS[:5] + ("tp_allreduce_seconds", "pp_p2p_seconds"):
        assert Breakdown.LABELS[name] in out


def test_json_answer(capsys):
    assert main([str(EXAMPLE), "--platform", "vista-gh200", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["platform"] == "vista-gh200"
    assert d["job"]["layout"]["tp"] == 4
    assert len(d["interval_seconds"]) == 2 and d["total_seconds"] > d["iteration_seconds"]


def test_list_platforms(capsys):
    assert main(["--list-platforms"]) == 0
    out = capsys.readouterr().out
    for name in ("perlmutter-a100", "vista-gh200", "dgx-a100", "dgx-h100"):
        assert name in out
    assert "H100 compute and host costs measured" in out


@pytest.mark.parametrize("text,needle", [
    ("[model]\nlayers = 44\nhidden = 6144\nheads = 64\nseq_len = 2048\n[layout]\ntp = 3\n", "layout.tp"),
    ("[model]\nlayers = 44\nhidden = 6144\nheads = 64\nseq_len = 2048\nwidth = 3\n", "model.width"),
    ("[model]\nlayers = -1\n", "model.layers"),
    ("[model\n", "not valid TOML"),
])
def test_bad_job_one_line_exit_2(tmp_path, text, needle):
    job = tmp_path / "bad.toml"
    job.write_text(text)
    r = subprocess.run([sys.executable, "-m", "slurm_plugin.cli_predict", str(job), "--platform",
                        "perlmutter-a100"], capture_output=True, text=True)
    assert r.returncode == 2
    assert needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_unknown_platform_and_no_platform(tmp_path, capsys):
    assert main([str(EXAMPLE), "--platform", "nope"]) == 2
    assert "no platform 'nope'" in capsys.readouterr().err
    job = tmp_path / "j.toml"
    job.write_text("[model]\nlayers = 4\nhidden = 256\nheads = 4\nseq_len = 128\n")
    assert main([str(job)]) == 2
    assert "no platform" in capsys.readouterr().err


def test_batch_script_through_the_real_parser(capsys):
    """perf-predict reads an existing NeoX batch script (never runs it) and reports where keys came from."""
    script = ROOT / "tests" / "launch" / "data" / "corpus" / "01_neox_20b" / "job.sbatch"
    assert main([str(script), "--platform", "perlmutter-a100", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    expected = json.loads((script.parent / "expected.json").read_text())
    for section in ("model", "layout"):
        for key, value in expected.get("job", {}).get(section, {}).items():
            assert d["job"][section][key] == value, f"{section}.{key}"
    assert d["job"]["script"]["framework"] == "neox"
    assert any(v.startswith(str(script.parent)) or ".yml:" in v or "job.sbatch:" in v
               for v in d["job"]["script"]["provenance"].values())
    assert d["iteration_seconds"] > 0


def _write_job(tmp_path, model, layout, name="job.toml"):
    lines = ["[model]"] + [f"{k} = {json.dumps(v)}" for k, v in model.items()]
    lines += ["[layout]"] + [f"{k} = {json.dumps(v)}" for k, v in layout.items()]
    lines += ["[run]", 'precision = "bf16"', "train_iters = 10"]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


LLAMA7B = {"layers": 32, "hidden": 4096, "heads": 32, "ffn_hidden": 11008, "seq_len": 4096, "vocab": 32000,
           "norm": "rmsnorm", "activation": "swiglu", "attention": "flash", "tied_embeddings": False}
GPT3 = {"layers": 96, "hidden": 12288, "heads": 96, "seq_len": 2048, "vocab": 50257, "pos_emb": "learned"}


def test_json_parameters_match_the_closed_forms(capsys, tmp_path):
    job = _write_job(tmp_path, LLAMA7B, {"pp": 2, "tp": 2, "dp": 2})
    assert main([str(job), "--platform", "dgx-h100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"] == 6_738_415_616
    job = _write_job(tmp_path, GPT3, {"pp": 8, "tp": 8, "dp": 1}, "gpt3.toml")
    assert main([str(job), "--platform", "dgx-a100", "--json"]) == 0
    # Megatron pads the vocabulary to a multiple of 128 × tp: 50257 -> 51200 at tp = 8.
    L, h, s, v_padded = 96, 12288, 2048, 51200
    want = 12 * L * h * h + 13 * L * h + v_padded * h + s * h + 2 * h
    assert json.loads(capsys.readouterr().out)["parameters"] == want


def test_json_stages_carry_the_memory_perf_advise_uses(capsys, tmp_path):
    from predictor import memory
    from predictor.job import TrainingJob
    job = _write_job(tmp_path, LLAMA7B, {"pp": 4, "tp": 2, "dp": 1, "micro_batch": 2, "micro_batches": 8,
                                         "recompute": "selective"})
    assert main([str(job), "--platform", "dgx-h100", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    stages = d["stages"]
    assert [s["layers"] for s in stages] == d["details"]["stage_layers"] and len(stages) == 4
    assert sum(s["layers"] for s in stages) == 32
    assert all(s["forward_seconds"] > 0 and s["backward_seconds"] > 0 and s["fits"] for s in stages)
    tj = TrainingJob.from_toml(job)
    assert max(s["peak_memory_bytes"] for s in stages) == int(memory.estimate(tj.model, tj.layout, "bf16").total)


def test_text_says_when_the_job_does_not_fit(capsys, tmp_path):
    job = _write_job(tmp_path, GPT3, {"pp": 1, "tp": 1, "dp": 8, "recompute": "none"})
    assert main([str(job), "--platform", "dgx-a100"]) == 0
    out = capsys.readouterr().out
    assert "DOES NOT FIT in 80 GiB" in out and "174.60 B parameters" in out


def _partition_script(tmp_path, monkeypatch, site_config):
    """The NeoX corpus script asking for partition h100, and ``site_config`` as $PERFCAST_CONFIG."""
    import re
    cfg = tmp_path / "perfcast.toml"
    cfg.write_text(site_config)
    monkeypatch.setenv("PERFCAST_CONFIG", str(cfg))
    monkeypatch.delenv("SBATCH_PARTITION", raising=False)
    src = (ROOT / "tests" / "launch" / "data" / "corpus" / "01_neox_20b" / "job.sbatch").read_text()
    script = tmp_path / "job.sbatch"
    script.write_text(re.sub(r"#SBATCH (-p|--partition)[ =]\S+", "#SBATCH --partition=h100", src))
    for f in (ROOT / "tests" / "launch" / "data" / "corpus" / "01_neox_20b").iterdir():
        if f.name not in ("job.sbatch", "expected.json") and f.is_file():
            (tmp_path / f.name).write_text(f.read_text())
        elif f.is_dir():
            import shutil
            shutil.copytree(f, tmp_path / f.name, dirs_exist_ok=True)
    return script


def test_partition_of_the_script_picks_the_platform_through_the_site_config(tmp_path, capsys, monkeypatch):
    """As sbatch does: #SBATCH --partition -> the site config's platform, and the CLI says which."""
    script = _partition_script(tmp_path, monkeypatch, '[partitions.h100]\nplatform = "dgx-h100"\n'
                                                      '[partitions.a100]\nplatform = "dgx-a100"\n')
    cfg = tmp_path / "perfcast.toml"
    assert main([str(script), "--json"]) == 0, capsys.readouterr().err
    got = capsys.readouterr()
    assert json.loads(got.out)["platform"] == "dgx-h100"
    assert "platform dgx-h100 for partition h100" in got.err and "job.sbatch:6" in got.err
    assert str(cfg) in got.err
    # $SBATCH_PARTITION wins over the script, as it does for sbatch
    monkeypatch.setenv("SBATCH_PARTITION", "a100")
    assert main([str(script), "--json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["platform"] == "dgx-a100" and "$SBATCH_PARTITION" in got.err
    monkeypatch.delenv("SBATCH_PARTITION")
    # --platform still wins, silently
    assert main([str(script), "--platform", "perlmutter-a100", "--json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["platform"] == "perlmutter-a100" and "for partition" not in got.err


def test_partition_the_site_config_lacks_is_one_line(tmp_path, capsys, monkeypatch):
    script = _partition_script(tmp_path, monkeypatch, '[partitions.a100]\nplatform = "dgx-a100"\n')
    assert main([str(script)]) == 2
    err = capsys.readouterr().err
    assert "partition 'h100' (" in err and "job.sbatch:6" in err and "a100" in err and "--platform" in err
    monkeypatch.setenv("PERFCAST_CONFIG", str(tmp_path / "nope.toml"))
    assert main([str(script)]) == 2
    err = capsys.readouterr().err
    assert "needs the site config" in err and "no such file" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("text,needle", [
    ("[model]\nlayers = 44\nhidden = 6144\nheads = 64\nkv_heads = 0\nseq_len = 2048\n", "model.kv_heads: must be at least 1"),
    ("[model]\nlayers = 44\nhidden = 6144\nheads = 64\nffn_hidden = 0\nseq_len = 2048\n", "model.ffn_hidden: must be at least 1"),
    ("\ufeff[model]\nlayers = 44\nhidden = 6144\nheads = 64\nseq_len = 2048\n", "byte-order mark"),
])
def test_a_written_zero_or_a_bom_is_refused_not_replaced(tmp_path, capsys, text, needle):
    """kv_heads = 0 used to become the heads and ffn_hidden = 0 four hidden sizes, silently."""
    job = tmp_path / "bad.toml"
    job.write_text(text, encoding="utf-8")
    assert main([str(job), "--platform", "perlmutter-a100"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "bad.toml" in err


def test_json_warnings_carry_the_launch_warnings(tmp_path, capsys):
    """A typo the launch reader warns of is in the top-level `warnings` of --json, as in the text."""
    src = ROOT / "tests" / "launch" / "data" / "corpus" / "33_torchtitan_llama3_8b"
    for f in src.iterdir():
        (tmp_path / f.name).write_text(f.read_text())
    toml = tmp_path / "llama3_8b.toml"
    toml.write_text(toml.read_text().replace("log_freq = 10", "log_frq = 10"))
    assert main([str(tmp_path / "job.sbatch"), "--platform", "dgx-h100", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    typo = [w for w in d["warnings"] if "log_frq" in w]
    assert typo and typo[0] in d["job"]["script"]["warnings"]
    assert main([str(tmp_path / "job.sbatch"), "--platform", "dgx-h100"]) == 0
    assert typo[0] in capsys.readouterr().out


def test_an_empty_platform_or_a_job_platform_overridden_is_said(tmp_path, capsys):
    assert main([str(EXAMPLE), "--platform", ""]) == 2
    assert "--platform: empty name" in capsys.readouterr().err
    job = tmp_path / "job.toml"
    job.write_text(EXAMPLE.read_text().replace('platform = "perlmutter-a100"', 'platform = "perlmuter-a100"'))
    assert main([str(job), "--platform", "perlmutter-a100"]) == 0
    assert "'perlmuter-a100' is not used" in capsys.readouterr().err
    assert main([str(EXAMPLE), "--platform", "perlmutter-a100"]) == 0
    assert "is not used" not in capsys.readouterr().err


@pytest.mark.parametrize("argv,kind", [
    (["--platform", "no-such-platform", "--json"], "platform_not_found"),
    (["--platfrom", "perlmutter-a100", "--json"], "usage_error"),
])
def test_json_errors_are_one_json_object_on_stdout(capsys, argv, kind):
    # A script reading stdout of --json gets one object whether the command worked or not; the
    # person gets the same one line on stderr as without --json.
    assert main([str(EXAMPLE)] + argv) == 2
    cap = capsys.readouterr()
    err = json.loads(cap.out)["error"]
    assert err["type"] == kind and err["exit_code"] == 2
    assert cap.err.strip() == f"perf-predict: {err['message']}"


def test_json_error_names_the_job_key_and_file(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\nlayers = "x"\n')
    assert main([str(bad), "--platform", "dgx-a100", "--json"]) == 2
    err = json.loads(capsys.readouterr().out)["error"]
    assert (err["type"], err["key"], err["source"]) == ("job_error", "model.layers", str(bad))


def test_text_errors_print_nothing_on_stdout(capsys):
    assert main([str(EXAMPLE), "--platform", "no-such-platform"]) == 2
    assert capsys.readouterr().out == ""


def test_platform_and_partition_together_are_refused(capsys):
    # Two answers to "which platform?": say so rather than let one win silently.
    assert main([str(EXAMPLE), "--platform", "dgx-a100", "--partition", "gpu"]) == 2
    assert "--partition: not allowed with argument --platform" in capsys.readouterr().err


def test_a_script_with_no_launch_names_its_last_line(tmp_path, capsys):
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --gres=gpu:4\necho hello\n")
    assert main([str(script), "--platform", "dgx-a100"]) == 2
    assert capsys.readouterr().err.rstrip().endswith(f"({script}:4)")
