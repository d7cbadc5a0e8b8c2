"""Communication a launch overlaps with computation, which perfcast costs serially: said, not hidden.

Megatron-LM (``--tp-comm-overlap``, ``--overlap-grad-reduce``, ``--overlap-param-gather``) and NeMo
(``model.ub_tp_comm_overlap``, ``model.optim.overlap_grad_sync`` / ``overlap_param_sync``) can run
tensor-parallel collectives under the GEMMs (Transformer Engine's userbuffers) and the data-parallel
gradient reduction and parameter gather under the backward and forward passes.  How much they hide
depends on kernels perfcast has not measured, so the prediction keeps them whole and the reader
says which lines of the breakdown the job may spend less on: the prediction errs long by at most
those lines.
"""
from __future__ import annotations

from .facts import Facts

_WHAT = {
    "tp": ("tensor-parallel communication overlapped with the GEMMs", "(of which TP all-reduce)"),
    "grad": ("the data-parallel gradient reduction overlapped with the backward", "DP gradient reduction"),
    "param": ("the ZeRO parameter all-gather overlapped with the forward", "optimizer + all-gather"),
}


def warn_overlaps(f: Facts, found: "dict[str, str]") -> None:
    """One warning per overlap the launch turns on: ``found`` maps tp / grad / param to where
    the launch says so (option or key, with its origin)."""
    for kind, where in found.items():
        what, line = _WHAT[kind]
        f.warnings.append(f"{where}: {what} is not modelled; costed serially, so the iteration may "
                          f"take up to the breakdown's '{line}' time less")
