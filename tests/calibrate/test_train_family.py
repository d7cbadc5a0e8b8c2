"""calibrate/train_family.py: the job families are valid jobs, and the recorded runs are theirs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate import train_family
from predictor import TrainingJob

LENT = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h100-lent"
FAMILIES = {"family": train_family.family, "heldout": train_family.heldout, "fp8": train_family.fp8_pairs}


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("which", sorted(FAMILIES))
def test_every_job_of_a_family_is_a_valid_job_with_a_unique_name(which, device):
    jobs = FAMILIES[which](device)
    names = [name for name, _ in jobs]
    assert jobs and len(set(names)) == len(names)
    for name, job in jobs:
        parsed = TrainingJob.from_dict(job)
        assert (parsed.layout.pp, parsed.layout.tp) == (1, 1), name
        if device == "cpu":
            # the CPU family is sized for a 2-core machine: fp32 (no bf16 GEMMs there), short sequences
            assert parsed.model.seq_len <= 128, name


@pytest.mark.parametrize("which, recorded", [("family", "train-family.json"), ("heldout", "heldout.json"),
                                             ("fp8", "fp8-pairs.json")])
def test_the_lent_h100_runs_are_the_gpu_families_jobs(which, recorded):
    # Compared as parsed jobs: the older files predate run.fp8, whose default is no FP8.
    runs = json.loads((LENT / recorded).read_text())
    assert [(r["name"], TrainingJob.from_dict(r["job"])) for r in runs] == [
        (n, TrainingJob.from_dict(j)) for n, j in FAMILIES[which]("cuda")]


def test_fp8_pairs_differ_only_in_the_fp8_recipe():
    pairs = train_family.fp8_pairs("cuda")
    for (fp8_name, fp8_job), (bf16_name, bf16_job) in zip(pairs[::2], pairs[1::2]):
        assert fp8_name.removesuffix(" fp8") == bf16_name.removesuffix(" bf16")
        assert fp8_job["run"]["fp8"] == "delayed" and bf16_job["run"]["fp8"] == ""
        assert {**fp8_job, "run": {**fp8_job["run"], "fp8": ""}} == bf16_job


def test_job_dict_fills_the_layout_it_is_given():
    job = TrainingJob.from_dict(train_family.job_dict(3, 256, 4, 64, 2, 5, dp=2, activation="swiglu",
                                                      norm="rmsnorm", precision="fp32"))
    assert (job.model.layers, job.model.hidden, job.model.heads, job.model.seq_len) == (3, 256, 4, 64)
    assert (job.layout.micro_batch, job.layout.micro_batches, job.layout.dp) == (2, 5, 2)
    assert (job.model.activation, job.model.norm, job.run.precision) == ("swiglu", "rmsnorm", "fp32")


def test_job_sets():
    assert train_family.job_set("family", "cuda") == train_family.family("cuda")
    series = train_family.job_set("host-series", "cuda")
    # per-layer and per-micro-batch host costs need 2+ depths at each micro-batch count
    assert sorted({(j["model"]["layers"], j["layout"]["micro_batches"]) for _, j in series}) == [
        (2, 1), (2, 4), (8, 1), (8, 4), (16, 1), (16, 4)]
    seqs = [j["model"]["seq_len"] for _, j in train_family.job_set("long-seq", "cuda")]
    assert max(seqs) == 32768 and min(seqs) == 2048
    with pytest.raises(ValueError, match="not one of"):
        train_family.job_set("nope", "cuda")


def test_heldout_set_shares_no_job_with_the_measured_sets():
    # Its steps validate the stacks' modelling, so no job of it may be one a model was built on.
    held = train_family.job_set("heldout", "cuda")
    assert held[:len(train_family.heldout("cuda"))] == train_family.heldout("cuda")
    seen = [j for which in ("family", "host-series", "long-seq") for _, j in train_family.job_set(which, "cuda")]
    for name, job in held:
        assert job not in seen, name
        TrainingJob.from_dict(job)
    assert max(j["model"]["seq_len"] for _, j in held) == 24576
    assert all(TrainingJob.from_dict(j).run.precision == "fp32" for _, j in train_family.quick_jobs())
