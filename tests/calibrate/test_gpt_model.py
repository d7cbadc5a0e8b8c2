"""calibrate/gpt_model.py: the full-recomputation model computes what the plain one does.

Nothing here depends on how fast the machine is: only losses, gradients and counts.
"""
from __future__ import annotations

import math

import pytest

from predictor import TrainingJob

NEEDS_TORCH = "training the model needs torch (the calibrate extra)"


def _tiny(recompute: str) -> TrainingJob:
    return TrainingJob.from_dict({
        "model": {"layers": 2, "hidden": 64, "heads": 2, "seq_len": 32, "vocab": 256,
                  "attention": "fused_softmax", "pos_emb": "rotary"},
        "layout": {"pp": 1, "tp": 1, "dp": 1, "micro_batch": 2, "micro_batches": 1, "zero_stage": 0,
                   "recompute": recompute},
        "run": {"precision": "fp32"}, "cluster": {"gpus_per_node": 1}})


def test_full_recomputation_gives_the_same_loss_and_gradients():
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    from calibrate.errors import CalibrationError
    from calibrate.gpt_model import FlatGPT, RecomputeGPT, model_class

    assert model_class(_tiny("full")) is RecomputeGPT and model_class(_tiny("none")) is FlatGPT
    with pytest.raises(CalibrationError):
        FlatGPT(_tiny("full"), "cpu", 1)        # the plain model still refuses it
    with pytest.raises(CalibrationError):
        RecomputeGPT(_tiny("selective"), "cpu", 1)
    ids = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(0))
    out = []
    for model in (FlatGPT(_tiny("none"), "cpu", 1), RecomputeGPT(_tiny("full"), "cpu", 1)):
        loss = model.loss(ids, ids)
        loss.backward()
        out.append((float(loss.detach()), model.flat_grad.clone()))
    assert out[0][0] == pytest.approx(out[1][0], rel=1e-6)
    assert torch.allclose(out[0][1], out[1][1], atol=1e-6)
    assert float(out[1][1].abs().max()) > 0


def test_measure_training_runs_full_recomputation():
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    from calibrate.gpt_model import measure_training

    m = measure_training(_tiny("full"), steps=2, warmup=0, threads=1)
    assert len(m.steps) == 2 and math.isfinite(m.iteration_seconds) and m.iteration_seconds > 0
