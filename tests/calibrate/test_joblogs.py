"""calibrate.joblogs: steady-state iteration times from training logs, and hostile input."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calibrate.joblogs import (MAX_ITERATION_SECONDS, MIN_ITERATION_SECONDS, Sample, iteration_times,
                               steady_state)


def megatron(i: int, ms: float, total: int = 5000) -> str:
    # Megatron-LM's training_log line (megatron/training/training.py), with the timestamp it prints.
    return (f"[2024-05-01 12:00:{i % 60:02d}] iteration {i:8d}/{total:8d} | consumed samples: {i * 512:12d} | "
            f"elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): 180.2 | "
            f"learning rate: 3.000000E-04 | global batch size:   512 | lm loss: 7.123456E+00 | "
            f"loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | "
            f"number of nan iterations:   0 |")


def test_megatron_median_after_warm_up():
    # Iteration 1 is slow (CUDA context, NCCL set-up), 2 still settling, then steady around 1.2345 s;
    # one interval stretched by a checkpoint save does not move the median.
    times = {1: 9000.0, 2: 2100.0, 40: 4000.0}
    log = "\n".join(["using world size: 16", "> building GPT model ..."]
                    + [megatron(i, times.get(i, 1234.5 + (i % 3) - 1)) for i in range(1, 61)]
                    + ["[after training is done] datetime: 2024-05-01 12:10:00"])
    r = iteration_times(log)
    assert r.format == "megatron"
    assert r.median_seconds == pytest.approx(1.2345)
    assert len(r.samples) == 60 and len(r.steady) == 58      # iterations 1 and 2 dropped
    assert r.iterations_spanned == 59


def test_megatron_log_interval_drops_the_first_window_only():
    # log_interval 100: the first line averages iterations 1-100 (warm-up inside); later ones are steady.
    log = "\n".join(megatron(i, 1500.0 if i == 100 else 1000.0) for i in range(100, 1001, 100))
    r = iteration_times(log.encode())
    assert r.median_seconds == pytest.approx(1.0) and len(r.steady) == 9


@pytest.mark.parametrize("resume_at", [5, 501])
def test_restart_into_the_same_file_is_a_new_warm_up(resume_at):
    # A requeued job appends to its output: back to its last checkpoint (iteration numbers go back),
    # or on from a later one (they jump); either way its first iterations are warm-up again.
    first = [megatron(i, 8000.0 if i == 1 else 1000.0) for i in range(1, 11)]
    resumed = [megatron(i, 9000.0 if i in (resume_at + 1, resume_at + 2) else 1100.0)
               for i in range(resume_at + 1, resume_at + 11)]
    r = iteration_times("\n".join(first + [f"Resuming from checkpoint at iteration {resume_at}"] + resumed))
    assert sorted(set(r.steady)) == [1.0, 1.1]
    assert len(r.steady) == 8 + 8


def test_gpt_neox_line():
    line = (" samples/sec: 51.234 | iteration {:8d}/    5000 | elapsed time per iteration (ms): {:.1f} | "
            "learning rate: 1.600E-04 | approx flops per GPU: 150.2TFLOPS | lm_loss: 6.8123E+00 | "
            "loss scale: 4096.0 | number of skipped iterations:   0 | number of nan iterations:   0 |")
    log = "\n".join(line.format(i, 1249.1) for i in range(10, 101, 10))
    r = iteration_times(log)
    assert r.format == "gpt-neox" and r.median_seconds == pytest.approx(1.2491)


def test_gpt_neox_with_deepspeed_timers_prefers_the_iteration_line():
    neox = " samples/sec: 51.234 | iteration {:8d}/    5000 | elapsed time per iteration (ms): 2000.0 |"
    timers = "[2024-05-01 12:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | fwd: 500.0 | bwd: 900.0 | step: 50.0"
    log = "\n".join(x for i in range(1, 20) for x in (timers, neox.format(i)))
    r = iteration_times(log)
    assert r.format == "gpt-neox" and r.median_seconds == pytest.approx(2.0)


def test_nemo_progress_bar_and_nemo2_lines():
    # PyTorch Lightning's bar rewrites its line with \r; global_step numbers the iterations.
    bar = "\r".join(f"Epoch 0: : {i}%|#2 | {i}/1000 [02:03<15:02, v_num=0, reduced_train_loss=5.430, "
                    f"global_step={i}.0, consumed_samples={i * 256}.0, train_step_timing in s={4.2 if i == 0 else 1.02}]"
                    for i in range(0, 30))
    r = iteration_times(bar)
    assert r.format == "nemo" and r.median_seconds == pytest.approx(1.02)
    nemo2 = "\n".join(f"Training epoch 0, iteration {i}/99 | lr: 6.9e-06 | global_batch_size: 128 | "
                      f"global_step: {i} | reduced_train_loss: 11.96 | train_step_timing in s: "
                      f"{'30.5' if i < 2 else '6.08'} | consumed_samples: {i * 128}" for i in range(0, 20))
    r = iteration_times(nemo2)
    assert r.format == "nemo" and r.median_seconds == pytest.approx(6.08) and max(r.steady) == 6.08


def test_deepspeed_pipe_and_timer_lines():
    pipe = "\n".join(f"steps: {i * 10} loss: 2.3456 iter time (s): {1.234 if i > 1 else 5.0} samples/sec: 51.860"
                     for i in range(1, 8))
    r = iteration_times(pipe)
    assert r.format == "deepspeed-pipe" and r.median_seconds == pytest.approx(1.234)
    new = ("[2024-05-01 12:00:00,123] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | fwd: 412.34 | "
           "bwd: 801.20 | bwd_inner: 790.11 | bwd_allreduce: 10.50 | step: 30.12")
    micro = "[Rank 0] time (ms) | fwd_microstep: 100.0 | bwd_microstep: 200.0 | step_microstep: 5.0"
    r = iteration_times("\n".join([micro, new] * 6))
    assert r.format == "deepspeed-timers"
    assert r.median_seconds == pytest.approx((412.34 + 801.20 + 30.12) / 1000)   # bwd_inner not added twice
    old = "time (ms) | forward: 411.0 | backward: 800.9 | backward_inner: 789.0 | backward_allreduce: 11.2 | step: 29.7"
    assert iteration_times("\n".join([old] * 5)).median_seconds == pytest.approx(1.2416)
    batch = "time (ms) | train_batch: 1500.00 | batch_input: 10.00 | forward_microstep: 300.0"
    assert iteration_times("\n".join([batch] * 5)).median_seconds == pytest.approx(1.5)


def test_srun_label_prefix_and_repeated_ranks():
    # srun --label prefixes "0: "; two ranks printing the same iteration count once.
    lines = []
    for i in range(1, 12):
        lines += [f" 0: {megatron(i, 1000.0)}", f" 3: {megatron(i, 1000.0)}"]
    r = iteration_times("\n".join(lines))
    assert len(r.samples) == 22 and len(r.steady) == 9 and r.median_seconds == 1.0


@pytest.mark.parametrize("text", [
    "", "\x00\x01\x02", "nothing to see\n" * 100,
    "elapsed time per iteration (ms): nan | iteration 5/10",
    "elapsed time per iteration (ms): inf",
    "elapsed time per iteration (ms): -1234.5",
    "elapsed time per iteration (ms): 0.0",
    "elapsed time per iteration (ms): 1" + "0" * 5000,
    "elapsed time per iteration (ms): 1e999",
    "train_step_timing in s=1e308 global_step=1",
    "iter time (s): 12345678901234567890.5",
    "time (ms) | fwd: nan | bwd: 1 | step: 1",
    "time (ms) | fwd: 1e308 | bwd: 1e308 | step: 1e308",
    "time (ms) " + "| a: 1 " * 100000,
])
def test_garbage_never_gives_a_time(text):
    r = iteration_times(text * 3)
    assert r is None or r.median_seconds is None


def test_a_huge_line_is_skipped_not_parsed():
    log = ("x" * (1 << 20) + "elapsed time per iteration (ms): 1000.0 | iteration 5/10\n"
           + "\n".join(megatron(i, 2000.0) for i in range(1, 6)))
    assert iteration_times(log).median_seconds == pytest.approx(2.0)


def test_steady_state_unnumbered_drops_the_first_two():
    assert steady_state([Sample(9.0), Sample(3.0), Sample(1.0), Sample(1.1)]) == [1.0, 1.1]
    assert steady_state([Sample(9.0)]) == []


_FORMATS = [
    "elapsed time per iteration (ms): {v} | iteration {i}/100",
    " samples/sec: 1.0 | iteration {i}/100 | elapsed time per iteration (ms): {v} |",
    "train_step_timing in s={v}, global_step={i}.0]",
    "iteration {i}/99 | train_step_timing in s: {v}",
    "steps: {i} loss: 1.0 iter time (s): {v} samples/sec: 1.0",
    "time (ms) | fwd: {v} | bwd: {v} | step: {v}",
    "time (ms) | train_batch: {v}",
]
_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-10 ** 400, max_value=10 ** 400).map(str),
    st.sampled_from(["nan", "NaN", "-inf", "inf", "1e999", "-0", "0", ".", "1.2.3", "1e", "--1", "+-2", "0x10",
                     "1" * 3000, "9" * 20 + ".5", "1e-400"]),
    st.text(alphabet="0123456789.eE+-", min_size=0, max_size=60),
)


def _check(r) -> None:
    if r is None:
        return
    for s in r.samples:
        assert math.isfinite(s.seconds) and MIN_ITERATION_SECONDS <= s.seconds <= MAX_ITERATION_SECONDS
    m = r.median_seconds
    assert m is None or (math.isfinite(m) and MIN_ITERATION_SECONDS <= m <= MAX_ITERATION_SECONDS)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4096))
def test_fuzz_random_bytes(data):
    _check(iteration_times(data))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_FORMATS), _NUMBERS,
                          st.integers(min_value=-10 ** 30, max_value=10 ** 30),
                          st.text(max_size=40), st.sampled_from(["\n", "\r", "\r\n", "", "\x00"])),
                max_size=40))
def test_fuzz_format_lines_with_hostile_numbers(parts):
    text = "".join(junk + fmt.format(v=v, i=i) + end for fmt, v, i, junk, end in parts)
    _check(iteration_times(text))
    _check(iteration_times(text.encode("utf-8", "surrogatepass")))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=1, max_value=200_000), st.sampled_from(_FORMATS), st.sampled_from(["1234.5", "nan"]))
def test_fuzz_very_long_lines(width, fmt, v):
    line = "#" * width + fmt.format(v=v, i=7) + "|" * width
    _check(iteration_times("\n".join([line] * 3)))
