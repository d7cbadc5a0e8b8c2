"""One job's training steps under a software stack in this process: step seconds and peak memory.

``benchmarks/bench_gpu_stacks.py``'s stacks part calls :func:`one_stack` for each job and stack
(benchmarks/data/h100-lent/stacks): ``pytorch`` and ``sdpa_efficient`` run calibrate.gpt_model's
own loop, the module stacks (calibrate/stacks.py: ``ddp``, ``fsdp``, ``fsdp1``, ``compile``) need a
process group already up (one rank is enough).
"""
from __future__ import annotations

import gc

import torch

from predictor.job import TrainingJob

from .gpt_model import measure_training, token_batches
from .stacks import stack_step
from .timing import robust_seconds, time_steps

#: ``--sdpa-backend``: the SDPA backend a call pins, as ``model.attention_impl`` names its kernel.
SDPA_BACKENDS = {"flash": ("FLASH_ATTENTION", "sdpa_flash"), "cudnn": ("CUDNN_ATTENTION", "cudnn"),
                 "efficient": ("EFFICIENT_ATTENTION", "sdpa_efficient")}


def one_stack(stack: str, job_dict: dict, device: str, steps: int, warmup: int, sdpa_backend: str = "",
              preserve_rng_state: bool = True) -> dict:
    """Train ``job_dict`` under ``stack`` in this process: step seconds and peak bytes.
    ``preserve_rng_state`` False (TorchTitan's full AC) is said in the row."""
    if sdpa_backend:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[sdpa_backend][0])):
            row = one_stack(stack, job_dict, device, steps, warmup, preserve_rng_state=preserve_rng_state)
        return {**row, "sdpa_backend": SDPA_BACKENDS[sdpa_backend][1]}
    job = TrainingJob.from_dict(job_dict)
    # Earlier jobs' modules sit in reference cycles until the collector runs: collect them, so
    # that the peak below is this job's alone.
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        # What earlier jobs left allocated (FSDP1's modules outlive the collector: their
        # memory stays allocated): the job's own peak is the peak less this.
        start_allocated = int(torch.cuda.memory_allocated())
    if stack in ("pytorch", "sdpa_efficient"):
        if stack == "sdpa_efficient":
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                m = measure_training(job, device=device, steps=steps, warmup=warmup)
        else:
            m = measure_training(job, device=device, steps=steps, warmup=warmup)
        times, params = m.steps, m.params
    else:
        st = stack_step(stack, job, token_batches(job, device), device=device,
                        preserve_rng_state=preserve_rng_state)

        def step() -> None:
            st.gpt.begin_step()
            st.run()
        times = time_steps(step, steps, warmup, device)
        params = st.params
        del st, step
    row = {"measured_iteration_seconds": robust_seconds(times, device), "steps": times, "params": int(params)}
    if not preserve_rng_state:
        row["preserve_rng_state"] = False
    if device == "cuda":
        row["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        row["start_allocated_bytes"] = start_allocated
    return row
