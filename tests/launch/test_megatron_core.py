"""Megatron-core flags: virtual pipeline stages, attention backend, recompute, FP8, context parallelism."""
from __future__ import annotations

import pathlib

import pytest

from .helpers import parse_in

HEAD = "#!/bin/bash\n#SBATCH --nodes=2 --gpus-per-node=8 --ntasks-per-node=1\n"
BASE = ("srun torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
        "--num-attention-heads 32 --seq-length 4096 --micro-batch-size 1 --global-batch-size 128 "
        "--train-iters 100 --bf16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 ")


def _run(tmp_path: pathlib.Path, extra: str, prefix: str = ""):
    return parse_in(tmp_path, HEAD + prefix + BASE + extra + "\n")


def test_layers_per_virtual_stage(tmp_path):
    res = _run(tmp_path, "--num-layers-per-virtual-pipeline-stage 2")
    assert res.error is None, res.error
    assert res.job.layout.virtual_stages == 4        # 32 layers / 4 stages / 2 per virtual stage
    assert res.provenance["layout.virtual_stages"].endswith("job.sbatch:3")


def test_virtual_stages_per_rank(tmp_path):
    res = _run(tmp_path, "--num-virtual-stages-per-pipeline-rank 2")
    assert res.error is None, res.error
    assert res.job.layout.virtual_stages == 2


@pytest.mark.parametrize("backend, attention, impl", [
    ("flash", "flash", "flash2"),
    ("fused", "flash", "cudnn"),            # Transformer Engine's FusedAttention is cuDNN's fused kernel
    ("unfused", "unfused", ""), ("local", "unfused", ""), ("auto", "flash", "")])
def test_attention_backend(tmp_path, backend, attention, impl):
    res = _run(tmp_path, f"--attention-backend {backend}")
    assert res.error is None, res.error
    assert res.job.model.attention == attention and res.job.model.attention_impl == impl


@pytest.mark.parametrize("env, attention, impl", [
    ("NVTE_FLASH_ATTN=0", "flash", "cudnn"), ("NVTE_FUSED_ATTN=0", "flash", "flash2"),
    ("NVTE_FLASH_ATTN=0 NVTE_FUSED_ATTN=0", "unfused", ""), ("NVTE_FLASH_ATTN=1", "flash", "")])
def test_transformer_engine_environment_picks_the_kernel(tmp_path, env, attention, impl):
    res = _run(tmp_path, "", prefix="".join(f"export {e}\n" for e in env.split()))
    assert res.error is None, res.error
    assert res.job.model.attention == attention and res.job.model.attention_impl == impl
    if impl:
        assert "NVTE_" in res.provenance["model.attention_impl"]


def test_flash_attn_flags_name_their_kernel(tmp_path):
    assert _run(tmp_path, "--use-flash-attn").job.model.attention_impl == "flash2"


def test_recompute_block_is_full_with_warning(tmp_path):
    res = _run(tmp_path, "--recompute-granularity full --recompute-method block --recompute-num-layers 2")
    assert res.job.layout.recompute == "full"
    assert any("--recompute-method block --recompute-num-layers 2" in w for w in res.warnings)


def test_recompute_uniform_is_full_silently(tmp_path):
    res = _run(tmp_path, "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1")
    assert res.job.layout.recompute == "full"
    assert not any("recompute" in w for w in res.warnings), res.warnings


def test_recompute_selective(tmp_path):
    assert _run(tmp_path, "--recompute-granularity selective").job.layout.recompute == "selective"


def test_fp8_sets_the_recipe_on_top_of_bf16(tmp_path):
    res = _run(tmp_path, "--fp8-format hybrid")
    assert res.job.run.precision == "bf16" and res.job.run.fp8 == "delayed"
    assert not any("FP8 is modelled as bf16" in w for w in res.warnings)


@pytest.mark.parametrize("recipe, expected", [("delayed", "delayed"), ("tensorwise", "current"),
                                              ("blockwise", "current"), ("mxfp8", "current")])
def test_fp8_recipe_flag(tmp_path, recipe, expected):
    res = _run(tmp_path, f"--fp8-format e4m3 --fp8-recipe {recipe}")
    assert res.job.run.fp8 == expected, res.warnings


def test_unknown_fp8_recipe_is_warned_and_costed_as_current(tmp_path):
    res = _run(tmp_path, "--fp8-format e4m3 --fp8-recipe weird")
    assert res.job.run.fp8 == "current"
    assert any("--fp8-recipe weird" in w for w in res.warnings)


def test_no_fp8_without_the_format_flag(tmp_path):
    assert _run(tmp_path, "--bf16").job.run.fp8 == ""


def test_context_parallel_divides_dp(tmp_path):
    res = _run(tmp_path, "--context-parallel-size 2")
    assert res.error is None, res.error
    lay = res.job.layout
    assert (lay.cp, lay.dp, lay.tp, lay.pp) == (2, 1, 2, 4)
    assert res.job.model.attention == "flash"          # the TE default path
    assert res.provenance["layout.cp"].endswith("job.sbatch:3")


def test_context_parallel_with_unfused_attention_is_refused(tmp_path):
    res = _run(tmp_path, "--context-parallel-size 2 --attention-backend unfused")
    assert res.job is None and "flash" in res.error


def test_framework_is_recorded(tmp_path):
    res = _run(tmp_path, "")
    assert res.job.run.framework == "megatron" and res.job_dict["run"]["framework"] == "megatron"
    res = _run(tmp_path, "--deepspeed")
    assert res.job.run.framework == "megatron-deepspeed"


def test_overlaps_become_layout_keys(tmp_path):
    res = _run(tmp_path, "--sequence-parallel --tp-comm-overlap --use-distributed-optimizer "
               "--overlap-grad-reduce --overlap-param-gather")
    assert res.error is None, res.error
    lay = res.job.layout
    assert lay.overlap_grad_reduce and lay.overlap_param_gather and lay.tp_comm_overlap
    assert res.provenance["layout.overlap_grad_reduce"].startswith("--overlap-grad-reduce")
    assert res.provenance["layout.overlap_param_gather"].startswith("--overlap-param-gather")
    assert res.provenance["layout.tp_comm_overlap"].startswith("--tp-comm-overlap")
    assert "job.sbatch:3" in res.provenance["layout.tp_comm_overlap"]
    assert not any("costed serially" in w or "costed without" in w for w in res.warnings)
    # Nothing else about the job changes.
    plain = _run(tmp_path, "--sequence-parallel --use-distributed-optimizer")
    assert not plain.job.layout.overlap_grad_reduce and not plain.job.layout.overlap_param_gather
    assert not plain.job.layout.tp_comm_overlap
    expected = plain.job.to_dict()
    expected["layout"].update(overlap_grad_reduce=True, overlap_param_gather=True, tp_comm_overlap=True)
    assert res.job.to_dict() == expected


def test_tp_overlap_without_sequence_parallel_is_said_and_dropped(tmp_path):
    res = _run(tmp_path, "--tp-comm-overlap")
    assert res.error is None, res.error
    assert not res.job.layout.tp_comm_overlap
    said = [w for w in res.warnings if w.startswith("--tp-comm-overlap")]
    assert len(said) == 1 and "needs sequence parallelism; costed without it" in said[0]


def test_overlaps_under_deepspeed_are_said_and_costed_serially(tmp_path):
    res = _run(tmp_path, "--deepspeed --sequence-parallel --tp-comm-overlap --overlap-grad-reduce")
    assert res.error is None, res.error
    lay = res.job.layout
    assert not lay.tp_comm_overlap and not lay.overlap_grad_reduce
    said = [w for w in res.warnings if "is not modelled; costed serially" in w]
    assert {w.split(" ")[0] for w in said} == {"--tp-comm-overlap", "--overlap-grad-reduce"}


def test_param_gather_without_distributed_optimizer_is_said_and_dropped(tmp_path):
    res = _run(tmp_path, "--overlap-grad-reduce --overlap-param-gather")
    assert res.error is None, res.error
    assert res.job.layout.overlap_grad_reduce and not res.job.layout.overlap_param_gather
    assert any(w.startswith("--overlap-param-gather") and "distributed optimizer" in w for w in res.warnings)


def test_megatron_deepspeed_keeps_overlap_flags_as_warnings(tmp_path):
    res = _run(tmp_path, "--deepspeed --overlap-grad-reduce")
    assert res.error is None, res.error
    assert not res.job.layout.overlap_grad_reduce
    assert any(w.startswith("--overlap-grad-reduce") and "costed serially" in w for w in res.warnings)


@pytest.mark.parametrize("extra, expected", [("", ""), ("--grad-reduce-in-bf16", "bf16"),
                                             ("--accumulate-allreduce-grads-in-fp32", "fp32")])
def test_gradient_reduction_precision(tmp_path, extra, expected):
    res = _run(tmp_path, extra)
    assert res.error is None, res.error
    assert res.job.run.grad_reduce_precision == expected
