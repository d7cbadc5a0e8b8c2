"""The CPU family's model trained under three software stacks, for ``bench_cpu_family.py --stacks``.

* ``pytorch``: the plain loop of :mod:`calibrate.gpt_model` (flat buffers, one all-reduce, ZeRO-1
  by hand): what ``bench_cpu_family.py`` always measured.
* ``deepspeed``: the same model as a ``torch.nn.Module`` under ``deepspeed.initialize`` (its
  ``DeepSpeedEngine``: ZeRO stage 1 with a ``torch.optim.AdamW``, bucketed gradient reduction,
  gradient accumulation over the micro-batches), communication over gloo.
* ``fsdp``: the same module with ``torch.distributed.fsdp.fully_shard`` on each layer and on the
  root (FSDP2, parameters sharded over the data-parallel ranks, gathered per layer in forward and
  backward), ``torch.optim.AdamW``, gloo.

Each layer's arithmetic is :class:`calibrate.gpt_model.FlatGPT`'s (same kernels, same shapes), so
the stacks differ only in what the framework wraps around it.  The job each stack's run is
predicted as: ``pytorch`` run.framework "" (ZeRO-1), ``deepspeed`` run.framework "deepspeed"
(ZeRO-1), ``fsdp`` run.framework "torchtitan" (TorchTitan's data parallelism is this FSDP2) with
zero_stage 3.  Needs torch; ``deepspeed`` needs the deepspeed package (``pip install deepspeed``;
on a CPU it builds its shared-memory communication op once, with ninja).
"""
from __future__ import annotations

import os
import time
import warnings

STACKS = ("pytorch", "deepspeed", "fsdp")
# What the launch of each stack reveals (run.framework; the layout's ZeRO stage follows the stack).
STACK_FRAMEWORK = {"pytorch": "", "deepspeed": "deepspeed", "fsdp": "torchtitan"}
STACK_ZERO = {"pytorch": 1, "deepspeed": 1, "fsdp": 3}


def stack_job(job: dict, stack: str) -> dict:
    """``job`` (bench_cpu_family's job dict) as ``stack`` runs it."""
    out = {k: dict(v) for k, v in job.items()}
    out["run"]["framework"] = STACK_FRAMEWORK[stack]
    out["layout"]["zero_stage"] = STACK_ZERO[stack]
    return out


def stack_worker(rank: int, world: int, port: int, job_dict: dict, stack: str, threads: int,
                 steps: int, warmup: int, results) -> None:
    """One rank of ``stack`` training ``job_dict``; rank 0 puts (step seconds, parameters)."""
    warnings.filterwarnings("ignore")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import logging
    logging.disable(logging.WARNING)
    import torch
    import torch.distributed as dist

    from calibrate.stacks import module_gpt
    from predictor.job import TrainingJob

    torch.set_num_threads(threads)
    job = TrainingJob.from_dict(job_dict)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        gen = torch.Generator().manual_seed(1234 + rank)
        tokens = job.model.seq_len * job.layout.micro_batch
        batches = [(torch.randint(0, job.model.vocab, (tokens,), generator=gen),
                    torch.randint(0, job.model.vocab, (tokens,), generator=gen))
                   for _ in range(job.layout.micro_batches)]
        if stack == "deepspeed":
            import deepspeed
            model, gpt = module_gpt(job, world)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            cfg = {"train_micro_batch_size_per_gpu": job.layout.micro_batch,
                   "gradient_accumulation_steps": job.layout.micro_batches,
                   "zero_optimization": {"stage": 1}, "steps_per_print": 10 ** 9,
                   "wall_clock_breakdown": False}
            engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)

            def step() -> None:
                for ids, tgt in batches:
                    engine.backward(engine(ids, tgt))
                    engine.step()
        elif stack == "fsdp":
            from torch.distributed.device_mesh import init_device_mesh
            model, gpt = module_gpt(job, world, fsdp_mesh=init_device_mesh("cpu", (world,)))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

            def step() -> None:
                for ids, tgt in batches:
                    (model(ids, tgt) / len(batches)).backward()
                opt.step()
                opt.zero_grad(set_to_none=False)
        else:
            raise ValueError(f"stack {stack!r}: this worker runs deepspeed and fsdp")
        times: list[float] = []
        for s in range(warmup + steps):
            dist.barrier()
            t0 = time.perf_counter()
            gpt.begin_step()
            step()
            dt = time.perf_counter() - t0
            if s >= warmup:
                times.append(dt)
        per = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(per, op=dist.ReduceOp.MAX)
        if rank == 0:
            results.put((per.tolist(), sum(p.numel() for p in model.parameters())))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def measure_stack(job_dict: dict, stack: str, *, threads: int, steps: int, warmup: int,
                  timeout_s: float = 600.0) -> tuple[float, list[float], int]:
    """(robust seconds per iteration, step seconds, parameters) of ``stack`` training the job."""
    import torch.multiprocessing as mp

    from calibrate.collectives import free_port, spawn_until_result
    from calibrate.gpt_model import measure_training
    from calibrate.timing import robust_seconds
    from predictor.job import TrainingJob

    if stack == "pytorch":
        m = measure_training(TrainingJob.from_dict(job_dict), device="cpu", steps=steps, warmup=warmup,
                             threads=threads)
        return m.iteration_seconds, m.steps, m.params
    world = int(job_dict["layout"]["dp"])
    results = mp.get_context("spawn").SimpleQueue()
    args = (world, free_port(), job_dict, stack, threads, steps, warmup, results)
    spawn_until_result(stack_worker, args, world, results, timeout_s=timeout_s, what=f"{stack} rank")
    times, params = results.get()
    return robust_seconds(times, "cpu"), times, int(params)
