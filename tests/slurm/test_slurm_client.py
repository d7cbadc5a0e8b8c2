"""slurm_plugin.slurm_client against the real dev cluster."""
from __future__ import annotations


def test_partitions_and_nodes(cluster):
    parts = {p.name: p for p in cluster.client.partitions()}
    assert set(parts) >= {"gpu", "short", "h100", "cpu"}
    gpu = parts["gpu"]
    assert (gpu.max_time_minutes, gpu.nodes, gpu.gpus_per_node, gpu.is_default) == (2880, 64, 8, True)
    assert parts["short"].max_time_minutes == 60 and parts["cpu"].max_time_minutes is None
    assert cluster.client.partition().name == "gpu"
    nodes = {n.name: n for n in cluster.client.nodes()}
    assert len(nodes) == 64 and nodes["dev001"].gpus == 8


def test_submit_wait_and_query(cluster):
    script = cluster.write_script("true.sh", "#!/bin/bash\n#SBATCH -p cpu -t 1\ntrue\n")
    res = cluster.client.submit(script, cwd=str(cluster.jobs_dir))
    info = cluster.client.wait(res.job_id, timeout=60, poll=0.2)
    assert info.state == "COMPLETED" and info.partition == "cpu" and info.time_limit_minutes == 1
    held = cluster.client.submit(None, ["--hold", "-p", "cpu"], text="#!/bin/bash\ntrue\n",
                                 user="nobody", cwd="/tmp")
    try:
        (job,) = cluster.client.jobs(ids=[held.job_id])
        assert job.user == "nobody" and job.state == "PENDING"
    finally:
        cluster.client.cancel([held.job_id])
