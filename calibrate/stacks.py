"""The GPT-shaped training model under the wrappers that software stacks put around it.

:class:`calibrate.gpt_model.FlatGPT` is the calibration's own loop (flat buffers, one all-reduce,
ZeRO-1 by hand).  Real stacks train the same arithmetic as a ``torch.nn.Module`` under a framework
wrapper; :func:`module_gpt` builds that module (one submodule per transformer layer, owning the
layer's parameters, so that FSDP can shard and gather layer by layer) and :func:`stack_step`
wraps it as a stack does, returning one training step:

* ``ddp``: ``DistributedDataParallel`` (bucketed gradient all-reduce hooks), ``torch.optim.AdamW``;
* ``fsdp``: FSDP2 ``fully_shard`` on each layer and on the root (TorchTitan's data parallelism),
  fp32 sharded parameters computed in bf16 (``MixedPrecisionPolicy(param_dtype=bfloat16,
  reduce_dtype=float32)``, TorchTitan's default) on CUDA; on a CPU the job's own dtype;
* ``fsdp1``: FSDP1 ``FullyShardedDataParallel`` wrapping each layer and the root (Composer's, which
  runs llm-foundry): ``FULL_SHARD``, ``use_orig_params``, ``limit_all_gathers``, fp32 flat
  parameters computed, reduced and buffered in bf16 on CUDA (Composer's ``PURE`` mixed precision,
  llm-foundry's usual); on one rank FSDP1 itself switches to ``NO_SHARD``;
* ``compile``: the module under ``torch.compile`` (what TorchTitan's ``compile`` turns on), no
  data-parallel wrapper, ``torch.optim.AdamW``.

``layout.recompute`` wraps each layer as TorchTitan does, before FSDP wraps it (so FSDP's hooks
run outside the checkpoint): ``full`` in PyTorch's non-reentrant ``checkpoint_wrapper``,
``selective`` in the same with TorchTitan's op-level policy (calibrate/op_sac.py) and no RNG state
kept; ``selective`` on the ``fsdp`` stack only (it is TorchTitan's), and none under ``fsdp1``
(Composer checkpoints inside its FSDP units, which this module does not build).

A process group must be initialised before ``ddp`` and ``fsdp`` (one rank is enough: the hooks,
collectives and copies run all the same).  :func:`measure_stack` below (gloo ranks on a CPU) and
``benchmarks/bench_gpu_stacks.py`` (one GPU) measure with these.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from predictor.job import TrainingJob

from . import kernels as K
from .errors import CalibrationError
from .gpt_model import FlatGPT, model_class, token_batches
from .timing import time_steps

#: The module stacks :func:`stack_step` builds.
MODULE_STACKS = ("ddp", "fsdp", "fsdp1", "compile")


def _check_known_recompute(recompute: str) -> None:
    if recompute not in ("none", "full", "selective"):
        raise CalibrationError(f"layout.recompute = {recompute!r}: the module stacks run none, full or selective")


def module_gpt(job: TrainingJob, world: int, device: str = "cpu", fsdp_mesh: Any = None,
               param_dtype: torch.dtype | None = None, mp_policy: Any = None,
               preserve_rng_state: bool = True) -> tuple[torch.nn.Module, FlatGPT]:
    """The FlatGPT model of ``job`` as an ``nn.Module`` on ``device``; the arithmetic is FlatGPT's.

    ``param_dtype`` stores the parameters in another dtype than the job's (FSDP's fp32 master
    parameters); ``fsdp_mesh`` shards each layer and the root with FSDP2 ``fully_shard``;
    ``preserve_rng_state`` is full recomputation's ``checkpoint_wrapper`` argument (PyTorch's
    default and Composer's True, TorchTitan's False)."""
    # FlatGPT checks the layouts its own loop runs (ZeRO 0/1); the arithmetic is the same here.
    # The module applies the recomputation itself (below), so FlatGPT builds the plain layer.
    recompute = job.layout.recompute
    _check_known_recompute(recompute)
    flat_job = dataclasses.replace(job, layout=dataclasses.replace(
        job.layout, zero_stage=min(job.layout.zero_stage, 1), recompute="none"))
    gpt = model_class(job)(flat_job, device, world, seed=0)
    names = list(gpt.params)

    def key(n: str) -> str:
        return n.split(".", 1)[1] if "." in n else n

    def own(t: torch.Tensor) -> torch.nn.Parameter:
        t = t.detach().clone()
        return torch.nn.Parameter(t if param_dtype is None else t.to(param_dtype))

    class Layer(torch.nn.Module):
        def __init__(self, i: int):
            super().__init__()
            self.i = i
            self.own_names = [key(n) for n in names if n.startswith(f"{i}.")]
            for n in self.own_names:
                self.register_parameter(n, own(gpt.params[f"{i}.{n}"]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # getattr, not named_parameters(): FSDP1 (use_orig_params) swaps the parameters for
            # plain tensor views of its gathered flat parameter while the forward runs.
            gpt.params.update({f"{self.i}.{k}": getattr(self, k) for k in self.own_names})
            return gpt._layer(self.i, x)

    def wrapped(layer: torch.nn.Module) -> torch.nn.Module:
        if recompute == "none":
            return layer
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
        if recompute == "full":
            return checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                      preserve_rng_state=preserve_rng_state)
        from .op_sac import op_sac_context
        return checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT, context_fn=op_sac_context,
                                  preserve_rng_state=False)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(wrapped(Layer(i)) for i in range(job.model.layers))
            self.own_names = [n for n in names if "." not in n]
            for n in self.own_names:
                self.register_parameter(n, own(gpt.params[n]))

        def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            gpt.params.update({n: getattr(self, n) for n in self.own_names})
            x = K.embedding(ids, gpt.params["emb"])
            for layer in self.layers:
                x = layer(x)
            x = gpt._norm(x, gpt.params["lnf_w"], gpt._p("lnf_b"))
            logits = K.linear(x, gpt.params["emb"], None)
            return K.vocab_parallel_cross_entropy(logits, targets).mean()

    gpt.flat = gpt.flat_grad = None         # the module owns its parameters now
    model = Model()
    if fsdp_mesh is not None:
        from torch.distributed.fsdp import fully_shard
        extra = {"mp_policy": mp_policy} if mp_policy is not None else {}
        for layer in model.layers:
            fully_shard(layer, mesh=fsdp_mesh, **extra)
        fully_shard(model, mesh=fsdp_mesh, **extra)
    return model, gpt


@dataclasses.dataclass
class StackStep:
    """One training step of a wrapped model (``run`` trains every micro-batch and steps the
    optimizer), its parameter count, the FlatGPT whose ``begin_step`` starts a step, and the
    wrapped model's loss (``forward(ids, targets)``)."""

    run: Callable[[], None]
    params: int
    gpt: FlatGPT
    forward: Callable[..., torch.Tensor]


def _optimizer(params: Any, device: str) -> torch.optim.Optimizer:
    # The fused CUDA AdamW is what TorchTitan and most recent trainers select on GPUs.
    return torch.optim.AdamW(params, lr=1e-4, fused=(device == "cuda"))


def check_recompute(stack: str, recompute: str) -> None:
    """Refuse a recomputation ``stack`` does not run (the module docstring), naming both."""
    _check_known_recompute(recompute)
    if recompute == "selective" and stack != "fsdp":
        raise CalibrationError(f"stack {stack!r}: layout.recompute = 'selective' is TorchTitan's op-level "
                               "checkpointing, built on the fsdp stack only")
    if stack == "fsdp1" and recompute != "none":
        raise CalibrationError(f"stack 'fsdp1': layout.recompute = {recompute!r} is not built (Composer "
                               "checkpoints inside its FSDP units)")


def stack_step(stack: str, job: TrainingJob, batches: list, *, device: str, world: int = 1,
               preserve_rng_state: bool = True) -> StackStep:
    """``job`` wrapped as ``stack`` trains it (see the module docstring), over ``batches``;
    ``preserve_rng_state``: :func:`module_gpt`'s."""
    if stack not in MODULE_STACKS:
        raise CalibrationError(f"stack {stack!r}: one of {', '.join(MODULE_STACKS)}")
    check_recompute(stack, job.layout.recompute)
    if stack == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device, (world,))
        mp = None
        pdtype = None
        if device == "cuda":
            from torch.distributed.fsdp import MixedPrecisionPolicy
            pdtype = torch.float32
            mp = MixedPrecisionPolicy(param_dtype=K.DTYPES[job.run.precision], reduce_dtype=torch.float32)
        model, gpt = module_gpt(job, world, device, fsdp_mesh=mesh, param_dtype=pdtype, mp_policy=mp,
                                preserve_rng_state=preserve_rng_state)
        forward: Callable[..., torch.Tensor] = model
    elif stack == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        pdtype = torch.float32 if device == "cuda" else None
        model, gpt = module_gpt(job, world, device, param_dtype=pdtype)
        low = K.DTYPES[job.run.precision]
        mp1 = MixedPrecision(param_dtype=low, reduce_dtype=low, buffer_dtype=low) if device == "cuda" else None
        layer_type = type(model.layers[0])
        forward = FullyShardedDataParallel(
            model, auto_wrap_policy=ModuleWrapPolicy({layer_type}), sharding_strategy=ShardingStrategy.FULL_SHARD,
            mixed_precision=mp1, use_orig_params=True, limit_all_gathers=True,
            device_id=torch.cuda.current_device() if device == "cuda" else torch.device("cpu"))
        model = forward
    else:
        model, gpt = module_gpt(job, world, device, preserve_rng_state=preserve_rng_state)
        if stack == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            forward = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()]
                                              if device == "cuda" else None)
        else:
            forward = torch.compile(model)
    opt = _optimizer(model.parameters(), device)

    def run() -> None:
        for ids, tgt in batches:
            (forward(ids, tgt) / len(batches)).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    return StackStep(run, sum(p.numel() for p in model.parameters()), gpt, forward)


# ----------------------------------------------------------------------------- CPU family stacks
# bench_cpu_family.py --stacks trains the CPU family under the plain loop of calibrate/gpt_model.py
# ("pytorch"), DeepSpeed's engine (ZeRO-1, bucketed reduction, accumulation over the micro-batches)
# and FSDP2 (:func:`stack_step`'s "fsdp"), on gloo ranks; calibrate.cpu_family.stack_job says how
# each is predicted.  DeepSpeed on a CPU builds its shared-memory communication op once (ninja).

def stack_worker(rank: int, world: int, port: int, job_dict: dict, stack: str, threads: int,
                 steps: int, warmup: int, results: Any) -> None:
    """One gloo rank of ``stack`` ("deepspeed", "deepspeed_zero2" or "fsdp") training ``job_dict``
    (DeepSpeed at the job's ZeRO stage); rank 0 puts (each step's seconds on the slowest rank,
    parameters)."""
    import logging
    import os
    import warnings

    import torch.distributed as dist

    # Refused before this process's warnings and logging are turned down for the ranks' work.
    if stack not in ("deepspeed", "deepspeed_zero2", "fsdp"):
        raise CalibrationError(f"stack {stack!r}: this worker runs deepspeed, deepspeed_zero2 and fsdp")
    warnings.filterwarnings("ignore")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    logging.disable(logging.WARNING)
    torch.set_num_threads(threads)
    job = TrainingJob.from_dict(job_dict)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        batches = token_batches(job, "cpu", rank)
        if stack.startswith("deepspeed"):
            import deepspeed
            model, gpt = module_gpt(job, world)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            cfg = {"train_micro_batch_size_per_gpu": job.layout.micro_batch,
                   "gradient_accumulation_steps": job.layout.micro_batches,
                   "zero_optimization": {"stage": job.layout.zero_stage}, "steps_per_print": 10 ** 9,
                   "wall_clock_breakdown": False}
            engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
            params = sum(p.numel() for p in model.parameters())

            def step() -> None:
                for ids, tgt in batches:
                    engine.backward(engine(ids, tgt))
                    engine.step()
        else:
            wrapped = stack_step("fsdp", job, batches, device="cpu", world=world)
            step, params, gpt = wrapped.run, wrapped.params, wrapped.gpt

        def timed_step() -> None:
            gpt.begin_step()
            step()

        per = torch.tensor(time_steps(timed_step, steps, warmup, before=dist.barrier), dtype=torch.float64)
        dist.all_reduce(per, op=dist.ReduceOp.MAX)
        if rank == 0:
            results.put((per.tolist(), params))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def measure_stack(job_dict: dict, stack: str, *, threads: int, steps: int, warmup: int,
                  timeout_s: float = 600.0) -> tuple[float, list[float], int]:
    """(robust seconds per iteration, step seconds, parameters) of ``stack`` ("pytorch",
    "deepspeed", "deepspeed_zero2" or "fsdp") training ``job_dict`` on its dp gloo ranks."""
    import torch.multiprocessing as mp

    from .collectives import free_port, spawn_until_result
    from .gpt_model import measure_training
    from .timing import robust_seconds

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
