"""Communication a launch overlaps with computation.

Megatron-LM (``--overlap-grad-reduce``, ``--overlap-param-gather``) and NeMo
(``model.optim.overlap_grad_sync`` / ``overlap_param_sync``) run the data-parallel gradient
reduction and the distributed optimizer's parameter gather bucket by bucket under the backward
and forward passes: the reader turns them into ``layout.overlap_grad_reduce`` /
``layout.overlap_param_gather``, which the predictor costs (predictor/overlap.py).  Tensor-parallel
communication under the GEMMs (``--tp-comm-overlap``, NeMo's ``model.ub_tp_comm_overlap``:
Transformer Engine's userbuffers) becomes ``layout.tp_comm_overlap`` (predictor/tp_overlap.py);
it needs sequence parallelism, without which Megatron-LM refuses it and NeMo turns it off, so
the reader says so and drops it.  Under DeepSpeed's engine (Megatron-DeepSpeed) none of these
exist: each is said, and the prediction keeps the communication whole.
"""
from __future__ import annotations

from .facts import Facts

_WHAT = {
    "tp": ("tensor-parallel communication overlapped with the GEMMs", "TP allreduce"),
    "grad": ("the data-parallel gradient reduction overlapped with the backward", "gradient reduce"),
    "param": ("the ZeRO parameter all-gather overlapped with the forward", "optimizer (+ all-gather)"),
}


def warn_overlaps(f: Facts, found: "dict[str, str]") -> None:
    """One warning per overlap the launch turns on that perfcast does not model: ``found`` maps
    tp / grad / param to where the launch says so (option or key, with its origin)."""
    for kind, where in found.items():
        what, line = _WHAT[kind]
        f.warnings.append(f"{where}: {what} is not modelled; costed serially, so the iteration may "
                          f"take up to the breakdown's '{line}' time less")


def set_overlaps(f: Facts, found: "dict[str, str]", distributed_optimizer: bool,
                 sequence_parallel: bool) -> None:
    """Megatron-core's overlaps as layout facts; ``found`` as for :func:`warn_overlaps`.  A
    parameter gather without the distributed optimizer or the gradient overlap, or a
    tensor-parallel overlap without sequence parallelism (both of which Megatron-LM refuses), is
    said and dropped."""
    grad, param, tp = found.get("grad"), found.get("param"), found.get("tp")
    if grad:
        f.set("overlap_grad_reduce", True, grad)
    if param:
        if grad and distributed_optimizer:
            f.set("overlap_param_gather", True, param)
        else:
            need = "the distributed optimizer" if not distributed_optimizer else "the gradient overlap"
            f.warnings.append(f"{param}: the parameter gather overlap needs {need}; costed without it")
    if tp:
        if sequence_parallel:
            f.set("tp_comm_overlap", True, tp)
        else:
            f.warnings.append(f"{tp}: the tensor-parallel overlap needs sequence parallelism; "
                              "costed without it")
