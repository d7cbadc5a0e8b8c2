"""ZeRO-3's per-layer all-gathers and reduce-scatters cost time, and perf-advise and perf-predict say
it is communication (it used to read as 0 % and a 0.000 s DP reduction: the time was there, inside
the forward and backward, but attributed to neither)."""
from __future__ import annotations

from predictor import TrainingJob, load_platform, predict
from predictor.advise import Candidate

JOB = """
[model]
layers = 12
hidden = 2048
heads = 16
seq_len = 2048
[layout]
pp = 1
tp = 1
dp = 16
micro_batch = 2
micro_batches = 1
zero_stage = {zero}
[run]
precision = "bf16"
train_iters = 10
"""


def _pred(tmp_path, zero):
    p = tmp_path / f"z{zero}.toml"
    p.write_text(JOB.format(zero=zero))
    job = TrainingJob.from_toml(str(p))
    plat = load_platform("dgx-a100")
    return job, predict(job, plat)


def test_zero3_communication_is_reported_as_such(tmp_path):
    job, z3 = _pred(tmp_path, 3)
    _, z2 = _pred(tmp_path, 2)
    b3 = z3.breakdown
    assert b3.dp_exposed_seconds > 0
    assert b3.dp_exposed_seconds <= b3.forward_seconds + b3.backward_seconds
    assert z3.to_dict()["breakdown"]["dp_exposed_seconds"] == b3.dp_exposed_seconds
    assert z2.breakdown.dp_exposed_seconds == 0.0          # only ZeRO-3 gathers per layer
    # what the layers cover is reported as hidden, the rest as exposed: together the serial cost
    assert z3.details.dp_hidden_seconds >= 0.0 and b3.dp_exposed_seconds + z3.details.dp_hidden_seconds > 0
    cand = Candidate(layout=job.layout, memory=None, fits=True, prediction=z3, flops_per_step=1.0,
                     gpus=16, tokens_per_step=1, peak_tflops=1.0, model=job.model)
    split = cand.time_split()
    assert split["communication"] >= b3.dp_exposed_seconds
    assert abs(sum(split.values()) - z3.iteration_seconds) < 1e-9
    assert cand.comm_share > 0.0
