"""torchrun's --nnodes against the job's nodes: a rendezvous the job's nodes cannot complete stops
the prediction (the job would wait out the rendezvous timeout and end without training); an
elastic range trains on the nodes that join it."""
from __future__ import annotations

from slurm_plugin.launch import SlurmRequest, parse_script

from .helpers import parse_in

MODEL = ("--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
         "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 --train-iters 1000 --bf16")


def _script(nodes: str, nnodes: str) -> str:
    return (f"#!/bin/bash\n#SBATCH --nodes={nodes}\n#SBATCH --gpus-per-node=8\n#SBATCH --ntasks-per-node=1\n\n"
            f"srun torchrun --nnodes {nnodes} --nproc_per_node 8 pretrain_gpt.py {MODEL}\n")


def test_more_nodes_than_the_job_has_never_trains_and_names_both_lines(tmp_path):
    for nnodes in ("4", "3:4"):
        res = parse_in(tmp_path, _script("2", nnodes))
        assert res.job is None, res.job
        assert res.error.startswith(f"cannot predict: torchrun --nnodes {nnodes} waits for {nnodes.split(':')[0]} node(s)"), res.error
        assert f"but the job has 2 node(s) ({tmp_path}/job.sbatch:2)" in res.error, res.error
        assert "give --nnodes 2" in res.error and res.error.endswith("job.sbatch:6)"), res.error


def test_an_elastic_range_trains_on_the_nodes_that_join(tmp_path):
    res = parse_in(tmp_path, _script("2", "1:4"))
    assert res.job is not None, res.error
    assert res.job.layout.dp == 16                 # 2 nodes × 8, not the range's 4 × 8
    assert any(w.startswith("torchrun --nnodes 1:4: the job's 2 node(s) (") and "join its rendezvous: "
               "predicting for 2" in w for w in res.warnings), res.warnings
    res = parse_in(tmp_path, _script("4", "1:2"))  # more nodes than the range's maximum: the maximum
    assert res.job is not None and res.job.layout.dp == 16, res.error


def test_a_node_range_that_can_reach_the_count_is_not_refused(tmp_path):
    # Slurm may give 2 to 4 nodes: 4 can join; predicted for torchrun's 4, with the mismatch said
    res = parse_in(tmp_path, _script("2-4", "4"))
    assert res.job is not None, res.error
    assert any("but the job has 2 node(s)" in w for w in res.warnings), res.warnings
    res = parse_in(tmp_path, _script("2-3", "4"))
    assert res.job is None and "but the job has at most 3 node(s) (--nodes=2-3, " in res.error, res.error


def test_the_callers_request_decides_the_nodes(tmp_path):
    path = tmp_path / "job.sbatch"
    path.write_text(_script("2", "4"))
    # sbatch --nodes=4 on the command line: job_submit.lua sends min_nodes = max_nodes = 4
    res = parse_script(str(path), request=SlurmRequest(nodes=4, max_nodes=4), deadline_s=10.0)
    assert res.job is not None and res.job.layout.dp == 32, res.error
    # a caller that gives only its minimum: the script's maximum (2) no longer holds
    res = parse_script(str(path), request=SlurmRequest(nodes=4), deadline_s=10.0)
    assert res.job is not None, res.error
    path.write_text(_script("4", "4"))
    res = parse_script(str(path), request=SlurmRequest(nodes=2, max_nodes=2), deadline_s=10.0)
    assert res.job is None and "but the job has 2 node(s) (request)" in res.error, res.error


def test_an_nnodes_torchrun_refuses_stops_as_it_does(tmp_path):
    for nnodes, why in (("x:4", "is not in MIN:MAX format"), (":4", "is not in MIN:MAX format"),
                        ("1:2:4", "is not in MIN:MAX format"), ("4:2", "has a maximum below its minimum"),
                        ("0:2", "has a minimum below 1")):
        res = parse_in(tmp_path, _script("2", nnodes))
        assert res.job is None and f"torchrun --nnodes {nnodes} {why}: torchrun stops at start" in res.error, res.error


def test_srun_on_fewer_nodes_runs_fewer_agents(tmp_path):
    script = _script("2", "2").replace("srun torchrun", "srun -N 1 torchrun")
    res = parse_in(tmp_path, script)
    assert res.job is None and "but srun starts it on 1 node(s) (srun -N 1)" in res.error, res.error
    assert "give --nnodes 1 (" in res.error and "SLURM_NNODES" not in res.error, res.error
    res = parse_in(tmp_path, _script("2", "1:2").replace("srun torchrun", "srun --nodes=1 torchrun"))
    assert res.job is not None and res.job.layout.dp == 8, res.error


def test_without_srun_the_count_is_taken_as_written(tmp_path):
    # how many agents join is not known (pdsh, ssh loops, ...): not judged, as before
    res = parse_in(tmp_path, _script("2", "4").replace("srun torchrun", "torchrun"))
    assert res.job is not None and res.job.layout.dp == 32, res.error
    assert any("torchrun --nnodes 4 but the job has 2 node(s)" in w for w in res.warnings), res.warnings


def test_a_callers_maximum_without_its_count_is_not_taken(tmp_path):
    path = tmp_path / "job.sbatch"
    path.write_text(_script("4", "4"))
    res = parse_script(str(path), request=SlurmRequest(max_nodes=2), deadline_s=10.0)
    assert res.job is not None and res.request.max_nodes == 4, res.error
