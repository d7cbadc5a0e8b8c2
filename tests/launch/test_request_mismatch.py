"""The Slurm request against the launch: a launcher that starts more ranks per node than the request
gives a node GPUs cannot run (an error naming both lines), fewer is predicted as run and said; a value
sbatch refuses on an #SBATCH line stops the prediction naming the line; a framework config given to
perf-predict in place of the batch script is named as such."""
from __future__ import annotations

import pytest

from slurm_plugin.cli_predict import main

from .helpers import parse_in

MEGATRON = ("pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers 24 "
            "--hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 "
            "--micro-batch-size 4 --global-batch-size 256 --train-iters 5000 --bf16\n")


def _script(sbatch: str, launch: str) -> str:
    return "#!/bin/bash\n" + "".join(f"#SBATCH {line}\n" for line in sbatch.split("|")) + launch + MEGATRON


# ---- finding 1: ranks per node against the GPUs the request gives a node
@pytest.mark.parametrize("sbatch, launch, starts, ranks_line", [
    ("--nodes=2 --ntasks-per-node=1|--gpus-per-node=4", "torchrun --nproc_per_node 8 --nnodes 2 ",
     "torchrun --nproc_per_node 8 starts 8 rank(s) per node", 4),
    ("--nodes=2 --ntasks-per-node=1|--gres=gpu:4", "torchrun --nproc_per_node 8 --nnodes 2 ",
     "torchrun --nproc_per_node 8 starts 8 rank(s) per node", 4),
    ("--nodes=2 --ntasks-per-node=1|--gpus=8", "torchrun --nproc_per_node 8 --nnodes 2 ",
     "torchrun --nproc_per_node 8 starts 8 rank(s) per node", 4),
    ("--nodes=2|--gpus-per-node=4|--ntasks-per-node=8", "srun python ",
     "srun starts 16 task(s), 8 per node (one rank each)", 4),
    ("--nodes=1|--gpus-per-node=4", "deepspeed --num_gpus 8 ", "deepspeed --num_gpus 8 starts 8 rank(s) per node", 4),
])
def test_more_ranks_per_node_than_gpus_stops_naming_both_lines(tmp_path, sbatch, launch, starts, ranks_line):
    res = parse_in(tmp_path, _script(sbatch, launch))
    assert res.job is None, res.job
    assert f"{starts} but the request gives a node 4 GPU(s) (" in res.error, res.error
    assert "job.sbatch:3)" in res.error and "invalid device ordinal" in res.error, res.error
    assert res.error.endswith(f"job.sbatch:{ranks_line})"), res.error


def test_qa_megatron_torchrun_8_on_4_gpus(tmp_path):
    """The QA script: --gpus-per-node=4, torchrun --nproc_per_node 8, 2 nodes (was 16 GPUs, no word)."""
    res = parse_in(tmp_path, _script("--job-name=gpt-1.3b|--nodes=2|--ntasks-per-node=1|--gpus-per-node=4|"
                                     "--time=04:00:00", "torchrun --nproc_per_node 8 --nnodes $SLURM_NNODES "))
    assert res.job is None
    assert res.error.startswith("cannot predict: torchrun --nproc_per_node 8 starts 8 rank(s) per node but"), res.error
    assert "(" + str(tmp_path / "job.sbatch") + ":5)" in res.error, res.error


@pytest.mark.parametrize("sbatch, launch, gpus", [
    ("--nodes=2 --ntasks-per-node=1|--gpus-per-node=8", "torchrun --nproc_per_node 4 --nnodes 2 ", 8),
    ("--nodes=2|--ntasks-per-node=4 --gres=gpu:8", "srun python ", 8),
    ("--nodes=1|--gpus-per-node=8", "deepspeed --num_gpus 4 ", 4),
])
def test_fewer_ranks_than_gpus_is_predicted_as_run_and_said(tmp_path, sbatch, launch, gpus):
    res = parse_in(tmp_path, _script(sbatch, launch))
    assert res.job is not None, res.error
    assert res.job.layout.dp * 4 == gpus
    assert any("4 rank(s) per node" in w or "4 per node (one rank each)" in w for w in res.warnings), res.warnings
    assert any("but the request gives a node 8 GPUs (" in w and "job.sbatch:3" in w
               and f"predicting the {gpus} GPU(s) it uses" in w for w in res.warnings), res.warnings


def test_agreeing_launch_and_platform_default_say_nothing(tmp_path):
    ok = parse_in(tmp_path, _script("--nodes=2 --gpus-per-node=8", "torchrun --nproc_per_node=gpu --nnodes 2 "))
    assert ok.job is not None and ok.job.layout.dp == 4, ok.error
    assert not any("rank(s) per node" in w for w in ok.warnings), ok.warnings
    # no GPU count in the request: the platform's default is an assumption, not a request to judge
    free = parse_in(tmp_path, _script("--nodes=2", "torchrun --nproc_per_node 4 --nnodes 2 "))
    assert free.job is not None and not any("rank(s) per node" in w for w in free.warnings), free.warnings


def test_gpus_total_not_divisible_by_nodes_is_not_judged(tmp_path):
    res = parse_in(tmp_path, _script("--nodes=3|--gpus=20", "torchrun --nproc_per_node 8 --nnodes 3 "))
    assert "rank(s) per node" not in (res.error or ""), res.error


def test_deepspeed_num_nodes_without_hostfile_stops(tmp_path):
    """deepspeed/launcher/runner.py raises 'Num nodes is >1 but no extra nodes available via hostfile'
    (it used to be a warning that said so)."""
    res = parse_in(tmp_path, _script("--nodes=2 --gres=gpu:8", "deepspeed --num_gpus 8 --num_nodes 2 "))
    assert res.job is None and "deepspeed --num_nodes 2 without --hostfile" in res.error, res.error
    assert res.error.endswith("job.sbatch:3)"), res.error


# ---- finding 2 / 3: values sbatch refuses
@pytest.mark.parametrize("line, needle", [
    ("--gpus-per-node=eight", "#SBATCH --gpus-per-node=eight is not a GPU count: sbatch takes [type:]N"),
    ("--gpus-per-node=-3", "#SBATCH --gpus-per-node=-3 is not a GPU count"),
    ("--gres=gpu:eight", "#SBATCH --gres=gpu:eight: 'eight' is not a GPU count"),
    ("--gres=gpu:a100:x4", "'x4' is not a GPU count"),
    ("--gpus=two", "#SBATCH --gpus=two is not a GPU count"),
    ("--time=4hours", "#SBATCH --time=4hours is not a time limit sbatch accepts: it stops with 'Invalid --time"),
    ("-t 4h", "#SBATCH -t 4h is not a time limit sbatch accepts"),
    ("--nodes=0", "#SBATCH --nodes=0 is not a node count sbatch accepts: it refuses 0"),
    ("-N 0", "#SBATCH -N 0 is not a node count sbatch accepts"),
    ("--nodes=two", "#SBATCH --nodes=two is not a node count: sbatch refuses it (\"two\" is not a valid node count)"),
    ("--nodes=4-2", "maximum node count 2 is less than minimum node count 4"),
    ("--ntasks-per-node=0", "#SBATCH --ntasks-per-node=0 is not a count sbatch accepts"),
    ("--ntasks-per-node=eight", "'Invalid numeric value \"eight\" for --ntasks-per-node'"),
    ("--gpus-per-node", "#SBATCH --gpus-per-node without a value"),
])
def test_a_value_sbatch_refuses_stops_naming_the_line(tmp_path, line, needle):
    res = parse_in(tmp_path, _script(f"--nodes=2|{line}|--ntasks-per-node=1",
                                     "torchrun --nproc_per_node 8 --nnodes 2 "))
    assert res.job is None, res.job
    assert needle in res.error, res.error
    assert res.error.endswith("job.sbatch:3)"), res.error


@pytest.mark.parametrize("line, nodes, gpn", [
    ("--gres=gpu:a100:8", 2, 8), ("--gres=gpu:1g.10gb:8", 2, 8), ("--gres=gpu:8(S:0-1)", 2, 8),
    ("--gpus-per-node=h100:8", 2, 8), ("--time=2-00:00:00 --gpus-per-node=8", 2, 8),
    ("--nodes=2-4 --gpus-per-node=8", 2, 8), ("--nodes=-2 --gpus-per-node=8", 1, 8),
    ("--time=UNLIMITED --gres=gpu:8", 2, 8), ("--gpus-per-node=a100:4,v100:4", 2, 8),
])
def test_values_sbatch_accepts_still_read(tmp_path, line, nodes, gpn):
    res = parse_in(tmp_path, _script(f"--nodes=2|{line}", f"torchrun --nproc_per_node {gpn} --nnodes {nodes} "))
    assert res.job is not None, res.error
    assert (res.request.nodes, res.request.gpus_per_node) == (nodes, gpn)


def test_misspelt_option_name_is_still_a_warning(tmp_path):
    res = parse_in(tmp_path, _script("--nodes=2 --gpus-per-node=8|--gpus-per-ndoe=4",
                                     "torchrun --nproc_per_node 8 --nnodes 2 "))
    assert res.job is not None, res.error
    assert any("did you mean --gpus-per-node?" in w for w in res.warnings), res.warnings


# ---- finding 5: a config path from the environment is reported at its script line
def test_missing_deepspeed_config_under_home_names_the_script_line(tmp_path, monkeypatch):
    from slurm_plugin.launch import parse_script
    (tmp_path / "job.sbatch").write_text(
        "#!/bin/bash\n#SBATCH --nodes=1 --gpus-per-node=8\n"
        "deepspeed --num_gpus 8 pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 2 \\\n"
        "  --seq-length 64 --micro-batch-size 1 --global-batch-size 8 --train-iters 10 \\\n"
        "  --deepspeed --deepspeed_config $HOME/conf.json\n")
    res = parse_script(str(tmp_path / "job.sbatch"), env={"HOME": str(tmp_path / "home")}, deadline_s=10.0)
    assert res.job is None and "cannot read config" in res.error, res.error
    assert res.error.endswith("job.sbatch:5)") and "(environment)" not in res.error, res.error


# ---- finding 4: a framework config given to perf-predict
NEOX_YML = '{\n  "num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "seq_length": 2048,\n' \
           '  "pipe_parallel_size": 1, "model_parallel_size": 1,\n  "zero_optimization": {"stage": 1},\n}\n'
FOUNDRY_YAML = "variables:\n  max_seq_len: 2048\nmax_seq_len: ${variables.max_seq_len}\nmodel:\n" \
               "  name: mpt_causal_lm\n  n_layers: 24\nmax_duration: 100ba\nglobal_train_batch_size: 256\n"
DS_JSON = '{"train_batch_size": 256, "zero_optimization": {"stage": 1}, "bf16": {"enabled": true}}\n'
TITAN_TOML = '[job]\ndump_folder = "./outputs"\n[model]\nname = "llama3"\nflavor = "8B"\n' \
             '[training]\nlocal_batch_size = 1\nseq_len = 8192\nsteps = 1000\n[parallelism]\n' \
             'tensor_parallel_degree = 1\n'
NEMO_YAML = "trainer:\n  devices: 8\nmodel:\n  num_layers: 24\nexp_manager: {}\n"
JOB_TOML = "[model]\nlayers = 24\nhidden = 2048\nheads = 16\nseq_len = 2048\n[layout]\ntp = 2\npp = 2\n" \
           "dp = 4\nmicro_batch = 4\nmicro_batches = 16\n[run]\ntrain_iters = 100\n"


@pytest.mark.parametrize("name, text, what", [
    ("1-3B.yml", NEOX_YML, "looks like a GPT-NeoX config"),
    ("mpt.yaml", FOUNDRY_YAML, "looks like an llm-foundry config"),
    ("ds_config.json", DS_JSON, "looks like a DeepSpeed config"),
    ("llama3_8b.toml", TITAN_TOML, "looks like a TorchTitan config"),
    ("megatron_gpt_config.yaml", NEMO_YAML, "looks like a NeMo config"),
    ("other.json", "[1, 2]\n", "is a JSON file, not a batch script or a perfcast job file"),
])
def test_framework_config_given_to_perf_predict_is_named(tmp_path, capsys, name, text, what):
    (tmp_path / name).write_text(text)
    assert main([str(tmp_path / name), "--platform", "dgx-h100"]) == 2
    err = capsys.readouterr().err
    assert what in err and "give the batch script that launches" in err and "docs/job-file.md" in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("name", ["jobfile", "job.TOML"])
def test_job_file_under_another_name_is_read_as_one(tmp_path, capsys, name):
    (tmp_path / name).write_text(JOB_TOML)
    assert main([str(tmp_path / name), "--platform", "dgx-h100"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "PP-TP-DP 2-2-4" in out and "warning   no training launch" not in out


def test_batch_script_is_still_a_batch_script(tmp_path, capsys):
    (tmp_path / "run.sh").write_text(_script("--nodes=2 --gpus-per-node=8", "torchrun --nproc_per_node 8 "
                                                                             "--nnodes 2 "))
    assert main([str(tmp_path / "run.sh"), "--platform", "dgx-h100"]) == 0, capsys.readouterr().err


def test_srun_s_own_gpus_per_node_are_the_ranks_gpus(tmp_path):
    # the job has 8 GPUs a node, but srun gives its step 4: torchrun's 8 ranks find 4
    res = parse_in(tmp_path, _script("--nodes=2|--gpus-per-node=8|--ntasks-per-node=1",
                                     "srun --gpus-per-node=4 torchrun --nproc_per_node 8 --nnodes 2 "))
    assert res.job is None, res.job
    assert ("torchrun --nproc_per_node 8 starts 8 rank(s) per node but srun --gpus-per-node=4 gives a node "
            "4 GPU(s) (") in res.error, res.error
    res = parse_in(tmp_path, _script("--nodes=2|--gpus-per-node=8|--ntasks-per-node=1",
                                     "srun --gpus-per-node=8 torchrun --nproc_per_node 8 --nnodes 2 "))
    assert res.job is not None, res.error
