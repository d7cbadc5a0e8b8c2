"""calibrate/stack_runs.py: the lent H100's stack rows as a runs file (no torch needed)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate import stack_runs as mod
from calibrate.validate import load_runs
from predictor.kinds import kind_of

JOB = {"model": {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 512, "vocab": 1024, "attention": "flash"},
       "layout": {"pp": 1, "tp": 1, "dp": 1, "micro_batch": 1, "micro_batches": 2, "zero_stage": 1,
                  "recompute": "none"},
       "run": {"precision": "bf16"}, "cluster": {"gpus_per_node": 1}}
PROV = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "cuda": "13.0", "nccl": "2.28.9",
        "date": "2026-11-26T01:38:07+00:00"}


def _write(path, rows):
    path.write_text(json.dumps({"provenance": PROV, "steps": 4, "warmup": 2, "rows": rows}))
    return path


def _row(stack, secs, name="L2 h256", **extra):
    return {"stack": stack, "name": name, "job": JOB, "measured_iteration_seconds": secs, **extra}


def test_each_stack_is_the_job_its_launch_reveals_and_its_kind(tmp_path):
    f = _write(tmp_path / "a.json", [_row(s, 0.01 * (i + 1)) for i, s in enumerate(mod.STACKS)])
    runs = mod.runs_from_files([f])
    out = tmp_path / "runs.toml"
    out.write_text(mod.to_toml(runs))
    loaded = {r.name: r for r in load_runs(out)}          # what validate --runs reads
    assert set(loaded) == {f"{s} L2 h256" for s in mod.STACKS}
    keys = {n.split()[0]: kind_of(r.job).key for n, r in loaded.items()}
    assert keys == {"pytorch": "-/flash/bf16/none", "sdpa_efficient": "-/flash:sdpa_efficient/bf16/none",
                    "fsdp": "torchtitan/flash/bf16/none", "fsdp1": "llm-foundry/flash/bf16/none",
                    "ddp": "-/flash/bf16/none", "deepspeed": "deepspeed/flash/bf16/none",
                    "deepspeed_zero2": "deepspeed/flash/bf16/none"}      # the ZeRO stage is no part of a kind
    # Composer's PURE mixed precision reduces in bf16, not the fp32 a bf16 job defaults to.
    assert loaded["fsdp1 L2 h256"].job.run.grad_reduce_precision == "bf16"
    assert loaded["fsdp1 L2 h256"].job.layout.zero_stage == 3
    assert loaded["fsdp L2 h256"].job.layout.zero_stage == 3
    assert loaded["ddp L2 h256"].job.layout.zero_stage == 0
    assert loaded["deepspeed_zero2 L2 h256"].job.layout.zero_stage == 2
    assert loaded["pytorch L2 h256"].job.layout.zero_stage == 1
    assert JOB["layout"]["zero_stage"] == 1 and "framework" not in JOB["run"]    # the input is not changed
    assert "NVIDIA H100" in loaded["fsdp L2 h256"].source and "4 steps after 2 warm-ups" in loaded["fsdp L2 h256"].source


def test_a_recompute_row_is_its_own_run_named_by_its_recompute(tmp_path):
    selective = {**JOB, "layout": {**JOB["layout"], "recompute": "selective"}}
    f = _write(tmp_path / "a.json", [_row("fsdp", 0.030), _row("fsdp", 0.050, job=selective)])
    runs = {r["name"]: r for r in mod.runs_from_files([f])}
    assert set(runs) == {"fsdp L2 h256", "fsdp+selective L2 h256"}
    assert runs["fsdp+selective L2 h256"]["measured_iteration_seconds"] == 0.050
    assert runs["fsdp+selective L2 h256"]["job"]["layout"]["recompute"] == "selective"
    assert runs["fsdp+selective L2 h256"]["job"]["run"]["framework"] == "torchtitan"
    assert "stack fsdp+selective" in runs["fsdp+selective L2 h256"]["source"]
    assert mod.row_label(_row("fsdp", 0.03, job=selective)) == "fsdp+selective"
    assert mod.row_label(_row("fsdp", 0.03)) == "fsdp"
    # TorchTitan's full AC keeps no RNG state: a run apart from the default wrapper's.
    full = {**JOB, "layout": {**JOB["layout"], "recompute": "full"}}
    assert mod.row_label({**_row("fsdp", 0.03, job=full), "preserve_rng_state": False}) == "fsdp+full:norng"
    assert mod.row_label(_row("fsdp", 0.03, job=full)) == "fsdp+full"
    # split_label reads back what row_label writes (bench_gpu_stacks.py --stacks takes the same).
    assert mod.split_label("fsdp+full:norng") == ("fsdp", "full", False)
    assert mod.split_label("fsdp+selective") == ("fsdp", "selective", True)
    assert mod.split_label("ddp") == ("ddp", "", True)
    for bad in ("fsdp+selective:norng", "fsdp+full:rng", "ddp:norng"):
        with pytest.raises(mod.StackRowError, match="the only suffix is :norng, after \\+full"):
            mod.split_label(bad)


def test_repeats_keep_the_fastest_errors_and_other_stacks_are_left_out(tmp_path):
    a = _write(tmp_path / "a.json", [_row("fsdp", 0.030), _row("pytorch", 0.02, name="big"),
                                     _row("compile", 0.01)])
    b = _write(tmp_path / "b.json", [_row("fsdp", 0.036), _row("ddp", 0.0, name="big", error="OutOfMemoryError: x")])
    runs = mod.runs_from_files([a, b])
    assert [r["name"] for r in runs] == ["fsdp L2 h256", "pytorch big"]
    assert runs[0]["measured_iteration_seconds"] == 0.030
    assert "fastest of 2 measurements (30.0 ms / 36.0 ms" in runs[0]["source"]
    only = mod.runs_from_files([a, b], ["pytorch"])
    assert [r["name"] for r in only] == ["pytorch big"]


def _gpu_file(path, rows, **prov):
    path.write_text(json.dumps({"provenance": {**PROV, "device": "cuda", **prov}, "steps": 4, "warmup": 2,
                                "rows": rows}))
    return path


def test_a_gpu_row_names_the_kernel_sdpa_ran_where_its_launch_would_not(tmp_path):
    softmax = {**JOB, "model": {**JOB["model"], "attention": "fused_softmax"}}
    f = _gpu_file(tmp_path / "a.json", [_row("fsdp", 0.03), _row("fsdp1", 0.03), _row("pytorch", 0.02),
                                        _row("ddp", 0.02, name="sm", job=softmax)], sdpa_default="cudnn")
    runs = {r["name"]: r["job"]["model"].get("attention_impl", "") for r in mod.runs_from_files([f])}
    # TorchTitan's and llm-foundry's launches imply FlashAttention-2; these ran SDPA's cuDNN kernel.
    # A plain loop ran what a bundle's samples time (SDPA's choice): nothing to name.
    assert runs == {"fsdp L2 h256": "cudnn", "fsdp1 L2 h256": "cudnn", "pytorch L2 h256": "", "ddp sm": ""}


def test_a_pinned_row_is_its_own_run_and_names_its_kernel_unless_the_launch_implies_it(tmp_path):
    f = _gpu_file(tmp_path / "a.json", [_row(s, 0.04, sdpa_backend="sdpa_flash") for s in ("fsdp", "fsdp1", "pytorch")]
                  + [_row("fsdp", 0.03), _row("fsdp1", 0.05, sdpa_backend="sdpa_efficient")], sdpa_default="cudnn")
    runs = {r["name"]: r for r in mod.runs_from_files([f])}
    impl = {n: r["job"]["model"].get("attention_impl", "") for n, r in runs.items()}
    assert impl == {"fsdp L2 h256 sdpa_flash": "", "fsdp1 L2 h256 sdpa_flash": "",
                    "pytorch L2 h256 sdpa_flash": "sdpa_flash", "fsdp L2 h256": "cudnn",
                    "fsdp1 L2 h256 sdpa_efficient": "sdpa_efficient"}
    assert runs["fsdp L2 h256 sdpa_flash"]["measured_iteration_seconds"] == 0.04      # not merged with the cuDNN run


def test_an_older_gpu_file_takes_sdpa_s_recorded_choice_or_is_refused(tmp_path):
    known = _gpu_file(tmp_path / "old.json", [_row("fsdp", 0.03)])
    assert mod.runs_from_files([known])[0]["job"]["model"]["attention_impl"] == "cudnn"
    unknown = _gpu_file(tmp_path / "other.json", [_row("fsdp", 0.03)], gpu="NVIDIA A100-SXM4-80GB")
    with pytest.raises(mod.StackRowError, match=r"other.json: rows\[0\]: .*sdpa_default"):
        mod.runs_from_files([unknown])


@pytest.mark.parametrize("rows, match", [
    ([{"stack": "fsdp", "name": "x"}], r"rows\[0\]: needs stack, name and job"),
    ([{"stack": "fsdp", "name": "x", "job": "L2", "measured_iteration_seconds": 0.1}],
     r"rows\[0\]: row 'x': job and job.layout must be tables"),
    ([_row("fsdp", -1.0)], r"rows\[0\]: measured_iteration_seconds must be > 0"),
])
def test_bad_rows_name_the_file_and_row(tmp_path, rows, match):
    f = _write(tmp_path / "bad.json", rows)
    with pytest.raises(mod.StackRowError, match=match) as e:
        mod.runs_from_files([f])
    assert "bad.json" in str(e.value)
    with pytest.raises(mod.StackRowError, match="stack 'tensorrt'"):
        mod.runs_from_files([f], ["tensorrt"])


def test_the_committed_runs_file_is_what_the_converter_makes():
    data = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h100-lent" / "stacks"
    files = [data / f for f in ("stacks.json", "stacks2.json", "stacks3.json", "stacks4.json", "stacks5.json",
                                "stacks6.json", "hseries.json", "longseq.json", "longseq-flash.json", "stacks7.json")]
    assert (data / "stacks-runs.toml").read_text() == mod.to_toml(mod.runs_from_files(files))


def test_the_committed_runs_files_are_their_step_files_converted():
    """stacks-runs.toml (the family), rngseries-runs.toml (another lease's host-bound series) and
    heldout-runs.toml (the held-out jobs) are what benchmarks/gpu_stacks_runs.py makes of their
    files: a step file edited without them fails."""
    from calibrate.stack_files import HELDOUT_STEP_FILES, LENT_STACKS_DIR, OTHER_HOST_STEP_FILES, step_files
    family = mod.to_toml(mod.runs_from_files(step_files()))
    assert (LENT_STACKS_DIR / "stacks-runs.toml").read_text(encoding="utf-8") == family
    series = mod.runs_from_files([LENT_STACKS_DIR / name for name in OTHER_HOST_STEP_FILES])
    text = mod.to_toml(series, "of a host-bound series (another lease's machine)")
    assert (LENT_STACKS_DIR / "rngseries-runs.toml").read_text(encoding="utf-8") == text
    names = [r["name"] for r in series]
    assert len(names) == 36 and sum(n.startswith("fsdp+full:norng ") for n in names) == 6
    held = mod.runs_from_files([LENT_STACKS_DIR / name for name in HELDOUT_STEP_FILES])
    text = mod.to_toml(held, "held out: jobs no modelling choice saw (2026-11-28 lease)")
    assert (LENT_STACKS_DIR / "heldout-runs.toml").read_text(encoding="utf-8") == text
    # 11 jobs under each of 5 stacks, every one measured twice (the faster kept)
    assert len(held) == 55 and all("fastest of 2" in r["source"] for r in held)


def test_the_held_out_stacks_row_quotes_what_the_shipped_platform_predicts():
    # docs/modelling.md §6's held-out stacks row, recomputed from fresh predictions of its steps.
    from calibrate.stack_files import HELDOUT_STEP_FILES, LENT_STACKS_DIR
    doc = (Path(__file__).resolve().parents[2] / "docs" / "modelling.md").read_text(encoding="utf-8")
    row = [line for line in doc.splitlines() if line.startswith("| H100 held-out under five stacks (55 real steps")]
    checks = mod.predicted_against_measured("dgx-h100", [LENT_STACKS_DIR / n for n in HELDOUT_STEP_FILES])
    every = checks["all"]
    mape = 100 * sum(abs(c.error) for c in every) / len(every)
    covered = sum(c.covered for c in every)
    assert len(row) == 1 and len(every) == 55
    assert row[0].split("|")[3].strip().startswith(f"{mape:.1f} %, interval covers {covered}/55"), (mape, covered)
    # the five host-bound jobs (hidden 512-1,536) under FSDP2 without AC, and their interval misses
    host = [c for c in checks["fsdp"] if any(f" h{h} " in c.name for h in (512, 768, 1024, 1536))]
    errs = [100 * c.error for c in host]
    said = f"FSDP2 without AC {max(errs):.0f} to {min(errs):.0f} %".replace("-", "−")
    assert len(host) == 5 and f"the five host-bound jobs under {said}" in row[0], (said, row[0])
    assert "two of them above the interval" in row[0] and sum(not c.covered for c in host) == 2
