"""DeepSpeed's activation-checkpointing options as costs: what each checkpointed layer keeps, moves
and waits for (``layout.partition_activations``, ``checkpoint_in_cpu``, ``checkpoint_sync_each_layer``).

GPT-NeoX and Megatron-DeepSpeed route their checkpointed layers through
``deepspeed.checkpointing.checkpoint`` (DeepSpeed's ``CheckpointFunction``), configured from their
``partition_activations``, ``checkpoint_in_cpu`` and ``synchronize_each_layer`` arguments
(``deepspeed.checkpointing.configure``).  Per checkpointed layer and micro-batch it does:

* partitioned activations (tp > 1): in the forward each floating-point input of the checkpoint is
  cut to this rank's 1/tp slice (``narrow(...).clone()``) and only the slice is kept; before the
  recompute in the backward a zero-filled tensor of the whole input is allocated, the slice copied
  in and the rest all-gathered over the tensor-parallel group (``gather_partitioned_activations``),
  on the critical path: the recompute needs the gathered input;
* CPU checkpointing: the kept inputs (their slices, when partitioned) are copied to host memory in
  the forward (a blocking ``.cpu()`` into new pageable memory) and back in the backward
  (``.to(device)``), each copy on the compute stream at the measured pageable rates
  (:func:`offload_gbps`), each one waiting for the device like a synchronisation;
* synchronisation at each checkpoint boundary: ``synchronize()`` at the start and end of the
  forward and of the backward, four per layer: the host waits for the device, and the device then
  idles until the host has issued the next kernel.

What the checkpoint keeps is the layer's input under full recomputation and the attention core's
query, key and value under Megatron-style selective recomputation
(:func:`predictor.recipe.checkpoint_input_entries`); without recomputation nothing is
checkpointed and the options do nothing (DeepSpeed only acts inside its checkpoint function).

Megatron-LM's ``--distribute-saved-activations`` is the same partitioning in Megatron-core's own
``CheckpointFunction`` (``tensor_parallel/random.py``): the layer's first input split into a new
1/tp buffer in the forward and all-gathered into a new (uninitialised) one before the recompute,
for full recomputation only, and turned off under sequence parallelism
(``distribute_saved_activations and not sequence_parallel``); it is ``partition_activations``
under ``run.framework = "megatron"``.
docs/modelling.md §3 and §5 give the figures and their sources.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .recipe import checkpoint_input_entries
from .specs import Layout, ModelSpec

#: The keys, in the order warnings name them.
KEYS = ("partition_activations", "checkpoint_in_cpu", "checkpoint_sync_each_layer")
#: ``synchronize()`` calls per checkpointed layer and micro-batch with ``synchronize_each_layer``:
#: at the start and end of CheckpointFunction's forward and of its backward.
SYNCS_PER_LAYER = 4
#: One ``torch.cuda.synchronize()`` round trip with an empty queue, measured by ``perf-calibrate
#: host`` on the lent H100 (``sync_us`` = 7.256 in benchmarks/data/h100-lent/host.toml); the
#: shipped platforms' ``[host]`` tables do not carry it, so every platform uses this figure.
SYNC_ROUND_TRIP_SECONDS = 7.256e-6
#: The GPU's link to host memory, GB/s each way, from the data sheets (the name's first match):
#: NVLink-C2C on GH200 ("900 GB/s" both ways, NVIDIA GH200 Grace Hopper Superchip data sheet);
#: PCIe Gen5 x16 on H100 / H200 SXM ("128 GB/s" both ways, NVIDIA H100 Tensor Core GPU data
#: sheet); PCIe Gen4 x16 on A100 ("64 GB/s" both ways, NVIDIA A100 Tensor Core GPU data sheet).
#: Peaks of the link; DeepSpeed's copies are pageable and reach far less (below).
HOST_LINK_GBPS = (("gh200", 450.0), ("h200", 64.0), ("h100", 64.0), ("a100", 32.0))
#: An unnamed GPU's link: PCIe Gen4 x16, the slowest above (the answer warns).
DEFAULT_HOST_LINK_GBPS = 32.0
#: DeepSpeed's copies as it makes them: a blocking ``.cpu()`` into fresh pageable memory in the
#: forward and ``.to(device)`` from it in the backward, GB/s, on the lent H100's host
#: (benchmarks/bench_host_link.py, benchmarks/data/h100-lent/host-link: 64 and 256 MiB of bf16,
#: 1.77-1.78 and 10.2-11.4 GB/s, the slower kept, where pinned copies ran 54-55 GB/s over the
#: same PCIe Gen5 link): the host's page handling, not the link, sets them, so every GPU pays
#: them, capped by its link.
PAGEABLE_D2H_GBPS = 1.77
PAGEABLE_H2D_GBPS = 10.2


def host_link_gbps(gpu_name: str) -> tuple[float, bool]:
    """The GPU's host-link bandwidth each way in GB/s (:data:`HOST_LINK_GBPS`), and whether the
    GPU was known (else :data:`DEFAULT_HOST_LINK_GBPS`)."""
    name = gpu_name.lower()
    for key, gbps in HOST_LINK_GBPS:
        if key in name:
            return gbps, True
    return DEFAULT_HOST_LINK_GBPS, False


def offload_gbps(gpu_name: str) -> tuple[float, float, bool]:
    """CPU checkpointing's copy rates in GB/s, (to the host, back to the device), and whether the
    GPU's link was known: the measured pageable rates, capped by :func:`host_link_gbps`."""
    link, known = host_link_gbps(gpu_name)
    return min(link, PAGEABLE_D2H_GBPS), min(link, PAGEABLE_H2D_GBPS), known


#: Frameworks whose own checkpoint function partitions (Megatron-core's distribute_saved_activations).
MEGATRON_CORE_FRAMEWORKS = ("megatron",)


def options_set(layout: Layout) -> tuple[str, ...]:
    """The checkpointing keys ``layout`` turns on (:data:`KEYS` order)."""
    return tuple(k for k in KEYS if getattr(layout, k))


def options_in_effect(layout: Layout, framework: str = "", recompute: str = "") -> tuple[str, ...]:
    """The keys of :func:`options_set` that act on ``layout``'s checkpointed layers under
    ``recompute`` (default the layout's): all of them under DeepSpeed's checkpoint function with
    recomputation; under Megatron-core only the partitioning, with full recomputation and without
    sequence parallelism; none without recomputation."""
    recompute = recompute or layout.recompute
    if recompute not in ("full", "selective"):
        return ()
    keys = options_set(layout)
    if framework in MEGATRON_CORE_FRAMEWORKS:
        sp = layout.sequence_parallel and layout.tp > 1
        return ("partition_activations",) if "partition_activations" in keys and recompute == "full" \
            and not sp else ()
    return keys


def kept_share(layout: Layout, recompute: str = "", framework: str = "") -> float:
    """The share of a checkpoint's inputs that stays in GPU memory under ``recompute`` (default the
    layout's): none with CPU checkpointing, 1/tp with partitioned activations (tp > 1), all
    otherwise."""
    on = options_in_effect(layout, framework, recompute)
    if "checkpoint_in_cpu" in on:
        return 0.0
    if "partition_activations" in on and layout.tp > 1:
        return 1.0 / layout.tp
    return 1.0


@dataclass(frozen=True)
class LayerCheckpointCosts:
    """What the options add to one checkpointed layer for one micro-batch on one rank."""

    gather_shard_entries: float     # all-gather over the TP group before the recompute (0: none)
    copy_bytes_forward: float       # device memory traffic: the slice's clone
    copy_bytes_backward: float      # the zero-filled whole input and the slice copied into it
    offload_bytes: float            # to host in the forward, back in the backward (each)
    syncs_forward: int              # host waits for the device: synchronize() and blocking copies
    syncs_backward: int
    launches: int                   # kernels and copies the host issues beyond the layer's own


def layer_costs(model: ModelSpec, layout: Layout, element_bytes: float,
                framework: str = "") -> Optional[LayerCheckpointCosts]:
    """The options' additions per checkpointed layer and micro-batch, or None where they add
    nothing (no option in effect: :func:`options_in_effect`)."""
    on = options_in_effect(layout, framework)
    if not on:
        return None
    entries = checkpoint_input_entries(model, layout)
    t = layout.tp
    # The slice is cloned whatever tp is (the whole input at tp = 1, with nothing to gather).
    cloned = "partition_activations" in on
    partitioned = cloned and t > 1
    megatron = framework in MEGATRON_CORE_FRAMEWORKS
    shard = entries / t if partitioned else entries
    gather = shard if partitioned else 0.0
    copy_f = 2 * element_bytes * shard if cloned else 0.0
    # DeepSpeed gathers into a zero-filled tensor after copying its slice in; Megatron-core
    # all-gathers into an empty one.
    copy_b = element_bytes * (entries + 2 * shard) if partitioned and not megatron else 0.0
    offload = element_bytes * shard if "checkpoint_in_cpu" in on else 0.0
    syncs = SYNCS_PER_LAYER // 2 if "checkpoint_sync_each_layer" in on else 0
    blocking = 1 if "checkpoint_in_cpu" in on else 0
    launches = ((1 if megatron else 3) if partitioned else (1 if cloned else 0)) + 2 * blocking
    return LayerCheckpointCosts(gather, copy_f, copy_b, offload, syncs + blocking, syncs + blocking, launches)


def unapplied_warning(layout: Layout, framework: str = "") -> str:
    """The answer's warning when options are set that act on nothing ("" if none)."""
    unused = [k for k in options_set(layout) if k not in options_in_effect(layout, framework)]
    if not unused:
        return ""
    keys = ", ".join("layout." + k for k in unused)
    if layout.recompute not in ("full", "selective"):
        return (f"{keys} set with layout.recompute = \"none\": the checkpoint function applies "
                f"{'them' if len(unused) > 1 else 'it'} to checkpointed layers only, so nothing is costed")
    return (f"{keys}: Megatron-core distributes the saved inputs of full recomputation only, and not "
            f"under sequence parallelism; nothing is costed")
