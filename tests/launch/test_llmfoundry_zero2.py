"""llm-foundry's ZeRO-2 strategies: SHARD_GRAD_OP predicted with FSDP1's per-micro-batch collectives,
hybrid ZeRO-2 sharded within its groups (layout.dp_shard)."""
from __future__ import annotations

import pytest

from predictor import load_platform, predict

from .conftest import DATA
from .helpers import parse_in

MPT7B = (DATA / "llmfoundry" / "mpt-7b-h100.yaml").read_text()
HEAD = "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8\n"
COMPOSER = ("srun composer --world_size 16 --node_rank $SLURM_NODEID --master_addr node1 -n 8 "
            "scripts/train/train.py mpt.yaml ")


def _parse(tmp_path, overrides: str):
    res = parse_in(tmp_path, HEAD + COMPOSER + overrides + "\n", {"mpt.yaml": MPT7B})
    assert res.error is None, res.error
    return res


def test_shard_grad_op_pays_its_collectives_every_micro_batch(tmp_path):
    res = _parse(tmp_path, "fsdp_config.sharding_strategy=SHARD_GRAD_OP")
    job = res.job
    assert (job.layout.zero_stage, job.layout.dp_shard, job.run.framework) == (2, 0, "llm-foundry")
    assert not any("ZeRO2" in w or "ZeRO-2" in w for w in res.warnings)
    p = predict(job, load_platform("dgx-h100"))
    # No reduction once per step: each block's gather and reduce-scatter run inside every micro-batch.
    assert p.breakdown.gradient_reduce_seconds == 0.0
    assert p.breakdown.dp_exposed_seconds + p.details.dp_hidden_seconds > 0.0


@pytest.mark.parametrize("overrides, shard", [
    # Composer turns SHARD_GRAD_OP on a two-dimensional device mesh into _HYBRID_SHARD_ZERO2
    ("fsdp_config.sharding_strategy=SHARD_GRAD_OP fsdp_config.data_parallel_replicate_degree=2", 8),
    ("fsdp_config.sharding_strategy=_HYBRID_SHARD_ZERO2 fsdp_config.data_parallel_shard_degree=4 "
     "fsdp_config.data_parallel_replicate_degree=-1", 4),
])
def test_hybrid_zero2_shards_within_groups_and_all_reduces_across_them(tmp_path, overrides, shard):
    res = _parse(tmp_path, overrides)
    assert (res.job.layout.zero_stage, res.job.layout.dp_shard) == (2, shard)
    assert not any("ZeRO-2" in w or "ZeRO2" in w for w in res.warnings), res.warnings
    plat = load_platform("dgx-h100")
    hybrid = predict(res.job, plat)
    flat = predict(_parse(tmp_path / "flat", "fsdp_config.sharding_strategy=SHARD_GRAD_OP").job, plat)
    # Gradients and optimizer state sharded over the group, not all 16 ranks: more memory per GPU.
    assert hybrid.stages()[0]["peak_memory_bytes"] > flat.stages()[0]["peak_memory_bytes"]
    assert hybrid.iteration_seconds != flat.iteration_seconds


def test_hybrid_zero2_without_a_replicate_degree_is_said_to_be_costed_over_all_ranks(tmp_path):
    res = _parse(tmp_path, "fsdp_config.sharding_strategy=_HYBRID_SHARD_ZERO2")
    assert res.job.layout.zero_stage == 2 and res.job.layout.dp_shard == 0
    said = "_HYBRID_SHARD_ZERO2 without data_parallel_replicate_degree is costed as SHARD_GRAD_OP over all ranks"
    assert sum(said in w for w in res.warnings) == 1, res.warnings


def test_one_node_hybrid_zero2_is_shard_grad_op(tmp_path):
    head = "#!/bin/bash\n#SBATCH --nodes=1 --ntasks-per-node=1 --gpus-per-node=8\n"
    res = parse_in(tmp_path, head + "srun composer -n 8 scripts/train/train.py mpt.yaml "
                   "fsdp_config.sharding_strategy=_HYBRID_SHARD_ZERO2\n", {"mpt.yaml": MPT7B})
    assert res.error is None, res.error
    assert res.job.layout.zero_stage == 2 and not any("ZeRO2" in w or "ZeRO-2" in w for w in res.warnings)
