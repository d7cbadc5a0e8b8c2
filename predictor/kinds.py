"""A job's kind: its software stack as the launch reveals it.

Two jobs on the same partition can run the same model at very different speeds because the
framework around the kernels differs (a DeepSpeed engine against Megatron-core, FSDP against a
hand-written data-parallel loop), or the attention kernel, the precision, the recomputation.  The
operator regressors do not see most of that, so a site's finished jobs teach it per kind
(``perf-calibrate validate --fit``, ``harvest --refit``: per-kind factors and intervals in
``[fitted]``, :mod:`predictor.platform`).

A kind is the tuple (framework, attention, precision, recompute):

* ``framework``: ``run.framework`` (``""``: the launch did not say which);
* ``attention``: ``model.attention``, refined by ``model.attention_impl`` where the launch names
  the kernel (``flash:cudnn``);
* ``precision``: ``run.precision``, with ``+fp8-<recipe>`` when the linears run in FP8;
* ``recompute``: ``layout.recompute``.

Its :attr:`JobKind.key` (``"deepspeed/flash/bf16/none"``, ``"-"`` for an unnamed framework) is how
``[fitted]`` and a prediction's ``details`` name it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import BundleError

UNNAMED = "-"
KIND_FIELDS = ("framework", "attention", "precision", "recompute")


@dataclass(frozen=True, order=True)
class JobKind:
    framework: str        # run.framework; "" = not said
    attention: str        # model.attention[:model.attention_impl]
    precision: str        # run.precision[+fp8-recipe]
    recompute: str        # layout.recompute

    @property
    def key(self) -> str:
        return "/".join([self.framework or UNNAMED, self.attention, self.precision, self.recompute])

    @classmethod
    def from_key(cls, key: Any, where: str) -> "JobKind":
        """The kind a :attr:`key` names; a malformed key is a :class:`BundleError` naming ``where``."""
        parts = key.split("/") if isinstance(key, str) else []
        if len(parts) != 4 or not all(parts) or any(len(p) > 64 for p in parts):
            raise BundleError(f"{where}: kind {key!r} must be framework/attention/precision/recompute "
                              f"(e.g. \"deepspeed/flash/bf16/none\", \"{UNNAMED}\" for no framework)")
        fw, att, prec, rc = parts
        return cls("" if fw == UNNAMED else fw, att, prec, rc)

    def describe(self) -> str:
        return (f"framework {self.framework or 'not named'}, attention {self.attention}, "
                f"precision {self.precision}, recompute {self.recompute}")


def kind_of(job: Any) -> JobKind:
    """The kind of ``job`` (a :class:`predictor.job.TrainingJob`)."""
    m, run = job.model, job.run
    attention = m.attention + (f":{m.attention_impl}" if getattr(m, "attention_impl", "") else "")
    precision = run.precision + (f"+fp8-{run.fp8}" if run.fp8 else "")
    return JobKind(run.framework, attention, precision, job.layout.recompute)
