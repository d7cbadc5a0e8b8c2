"""perf-advise with the real predictor and the shipped Perlmutter platform.

Zhang et al. (2025) measured GPT-20B (44 layers, hidden 6144, 64 heads, seq 2048, parallel
residual, fused softmax, LayerNorm, GeLU, fp16, ZeRO-1, micro-batch 4, full recompute) on 128
Perlmutter GPUs; the layout they measured slowest, 4-8-4 (tensor parallelism of 8 across two
4-GPU nodes), must rank below 4-4-8.
"""
from __future__ import annotations

import pytest

from predictor import TrainingJob
from predictor.advise import SearchOptions, advise
from predictor.errors import PerfcastError


@pytest.fixture(scope="module")
def perlmutter():
    try:
        from predictor import load_platform
        return load_platform("perlmutter-a100")
    except (ImportError, PerfcastError) as exc:  # the shipped bundle is not built in this tree
        pytest.skip(f"perlmutter-a100 platform unavailable: {exc}")


def gpt20b(pp: int, tp: int, dp: int, micro_batches: int = 16) -> TrainingJob:
    return TrainingJob.from_dict({
        "model": {"layers": 44, "hidden": 6144, "heads": 64, "seq_len": 2048, "vocab": 50257,
                  "norm": "layernorm", "activation": "gelu", "attention": "fused_softmax",
                  "parallel_residual": True},
        "layout": {"pp": pp, "tp": tp, "dp": dp, "micro_batch": 4, "micro_batches": micro_batches,
                   "zero_stage": 1, "recompute": "full"},
        "run": {"precision": "fp16", "train_iters": 1000},
        "cluster": {"gpus_per_node": 4},
    })


PAPER_KNOBS = SearchOptions(allow_cross_node_tp=True, micro_batch=4, recompute="full", zero_stage=1,
                            virtual_stages=1)


def _rank(adv, pp, tp, dp):
    for i, c in enumerate(adv.candidates, 1):
        if (c.layout.pp, c.layout.tp, c.layout.dp) == (pp, tp, dp):
            return i
    raise AssertionError(f"{pp}-{tp}-{dp} not among the candidates")


def test_cross_node_tp_4_8_4_ranks_below_4_4_8(perlmutter):
    # The job as the paper ran 4-4-8 (16 micro-batches of 4 → 512 sequences per step); 4-8-4 at
    # the same global batch has 32 micro-batches.
    adv = advise(gpt20b(4, 4, 8), perlmutter, PAPER_KNOBS)
    assert _rank(adv, 4, 4, 8) < _rank(adv, 4, 8, 4)
    assert adv.current_rank == _rank(adv, 4, 4, 8)
    # From the other side: the user runs 4-8-4; the search finds 4-4-8 faster and says so.
    adv = advise(gpt20b(4, 8, 4), perlmutter, PAPER_KNOBS)
    assert _rank(adv, 4, 4, 8) < adv.current_rank
    assert adv.gpu_hours_saved > 0


def test_free_search_beats_the_job_and_only_lists_fitting_layouts(perlmutter):
    adv = advise(gpt20b(4, 8, 4), perlmutter, SearchOptions())
    assert adv.best.iteration_seconds < adv.current.iteration_seconds
    assert all(c.fits and c.memory.total_gib <= perlmutter.gpu.memory_gib for c in adv.candidates)
    assert all(c.layout.tp <= 4 for c in adv.candidates)
    best = adv.best
    assert 0 < best.mfu < 1
    assert 0 <= best.bubble_share < 1 and 0 <= best.comm_share <= 1
