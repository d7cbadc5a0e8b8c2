"""torch implementations of every operator of the predictor's catalog, forward and backward.

Two layers:

* functional building blocks (``linear``, ``qk_scores``, ``scaled_masked_softmax`` …) that the
  GPT-shaped model of :mod:`calibrate.gpt_model` is built from, so that the model trained in the
  end-to-end check runs exactly the kernels that were calibrated;
* :func:`build_kernel`, which allocates the inputs of one operator at one *physical* shape (the
  feature columns of ``predictor.operators``) and returns closures that run its forward pass and
  its backward pass (``torch.autograd.grad`` on a retained graph, so only backward kernels are
  timed) — or, for the optimizer, one Adam step on fp32 master weights.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
import torch.nn.functional as F

from predictor.fp8 import FP8_LINEARS
from predictor.operators import OPERATORS

from .attention import kernel as attention_kernel
from .errors import CalibrationError
from .timing import Timing, measure

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

#: The device-side sleep a call waits behind when timed for the device alone: the host issued one
#: isolated operator call in 9-564 µs on the lent H100 machines (perf-calibrate host: an add_ to
#: rope's backward, the slowest), so 1 ms outlasts the slowest nearly twice.
QUEUE_BEHIND_SECONDS = 1e-3

# Megatron's value for masked attention scores in the unfused path (not -inf: fp16-safe).
MASK_VALUE = -10000.0


# ------------------------------------------------------------------------------- building blocks
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(m, k) × (n, k)ᵀ + b: Megatron's column/row parallel GEMM on the local shard."""
    return F.linear(x, weight, bias)


def qk_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """QKᵀ as Megatron computes it: baddbmm into (batch, l, l) with beta 0, alpha 1/√d."""
    out = torch.empty(q.shape[0], q.shape[1], k.shape[1], dtype=q.dtype, device=q.device)
    return torch.baddbmm(out, q, k.transpose(1, 2), beta=0.0, alpha=scale)


def causal_mask(l: int, device: torch.device) -> torch.Tensor:
    """True above the diagonal: the positions a token must not attend to."""
    return torch.ones(l, l, dtype=torch.bool, device=device).triu_(1)


def fill_mask_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The unfused path: masked_fill with −10000 then softmax (Megatron's attention_mask_func)."""
    return torch.softmax(scores.masked_fill(mask, MASK_VALUE), dim=-1)


def softmax(scores: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores, dim=-1)


def scaled_masked_softmax(scores: torch.Tensor, scale: float, mask: torch.Tensor) -> torch.Tensor:
    """Causal (upper-triangular) masked softmax of scale·scores.

    Megatron's fused CUDA kernel when the apex/megatron extension is installed; otherwise the
    same arithmetic as three torch kernels (what torch-only training runs).
    """
    fused = _fused_upper_triang()
    if fused is not None and scores.is_cuda and scores.dtype in (torch.float16, torch.bfloat16):
        return fused.apply(scores, scale)
    return torch.softmax((scores * scale).masked_fill(mask, float("-inf")), dim=-1)


_FUSED: list = []
# The start of Megatron's import-time warnings about its fallbacks (a regular expression).
_MEGATRON_FALLBACK_WARNING = r"Transformer Engine and Apex are not installed"


def _fused_upper_triang():
    """Megatron's ScaledUpperTriangMaskedSoftmax autograd function, if importable (cached)."""
    if not _FUSED:
        fn = None
        try:  # pragma: no cover - only on GPU nodes with Megatron installed
            # Megatron's package imports warn, once per module, that Transformer Engine and Apex
            # are not installed (8 lines on every `perf-calibrate host`): only the fused softmax
            # is used here, which needs neither.  Those warnings alone are silenced.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_MEGATRON_FALLBACK_WARNING, category=UserWarning)
                from megatron.core.fusions.fused_softmax import ScaledUpperTriangMaskedSoftmax as fn
        except Exception:  # noqa: BLE001 - any import failure means "not available"
            fn = None
        _FUSED.append(fn)
    return _FUSED[0]


def fp8_cast_transpose(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast a 2-D tensor to FP8 under delayed scaling (the scale known from earlier steps: 1 here,
    the multiply folded into the cast as Transformer Engine folds it) and the transposed copy that
    Hopper's FP8 GEMMs need as a column-major operand.

    On a GPU one fused Triton kernel reads the tensor once and writes both, as TE's cast-transpose
    does: torch's own transposed copy of a one-byte tensor ran at ~280 GB/s on the lent H100
    (711 µs for 4096 x 24576 against 120 µs for the cast; benchmarks/profile_train_step.py
    --casts), which would have measured torch's copy kernel rather than an FP8 layer.  Elsewhere
    (CPU tests), or without Triton: a cast, then a transposed copy.
    """
    if t.is_cuda and t.dim() == 2:
        fused = _triton_cast_transpose()
        if fused is not None:
            return fused(t.contiguous(), dtype)
    t8 = t.to(dtype)
    return t8, t8.t().contiguous()


_TRITON_CAST: list = []       # [function or None], built on first use


def _triton_cast_transpose() -> "Callable[[torch.Tensor, torch.dtype], tuple[torch.Tensor, torch.Tensor]] | None":
    if _TRITON_CAST:
        return _TRITON_CAST[0]
    try:
        import triton
        import triton.language as tl
    except ImportError:
        _TRITON_CAST.append(None)
        return None

    @triton.jit
    def cast_transpose_kernel(x_ptr, y_ptr, yt_ptr, rows, cols, F8: tl.constexpr,
                              BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = (r[:, None] < rows) & (c[None, :] < cols)
        x = tl.load(x_ptr + r[:, None] * cols + c[None, :], mask=mask, other=0.0)
        y = x.to(F8)
        tl.store(y_ptr + r[:, None] * cols + c[None, :], y, mask=mask)
        mask_t = (c[:, None] < cols) & (r[None, :] < rows)
        tl.store(yt_ptr + c[:, None] * rows + r[None, :], tl.trans(y), mask=mask_t)

    f8_types = {torch.float8_e4m3fn: tl.float8e4nv, torch.float8_e5m2: tl.float8e5}

    def run(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        rows, cols = x.shape
        y = torch.empty(rows, cols, device=x.device, dtype=dtype)
        yt = torch.empty(cols, rows, device=x.device, dtype=dtype)
        grid = (triton.cdiv(rows, 64), triton.cdiv(cols, 64))
        cast_transpose_kernel[grid](x, y, yt, rows, cols, F8=f8_types[dtype], BLOCK_R=64, BLOCK_C=64)
        return y, yt

    _TRITON_CAST.append(run)
    return run


class Fp8Linear(torch.autograd.Function):
    """A linear layer with its three GEMMs in FP8 (forward E4M3 x E4M3, backward E5M2 gradients),
    a 16-bit result, as Transformer Engine's ``Linear`` under ``fp8_autocast`` with delayed scaling.

    ``w8``/``w8_t``: the weight and its transpose already in FP8 (cast once per step, as TE keeps
    them across a step's micro-batches).  The weight gradient comes back in 16 bits.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,  # type: ignore[override]
                w8: torch.Tensor, w8_t: torch.Tensor) -> torch.Tensor:
        x8, x8_t = fp8_cast_transpose(x, torch.float8_e4m3fn)
        one = torch.ones((), device=x.device, dtype=torch.float32)
        ctx.save_for_backward(x8_t, w8_t, one)
        ctx.has_bias = bias is not None
        return torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, bias=bias, out_dtype=x.dtype)

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):  # type: ignore[override]
        x8_t, w8_t, one = ctx.saved_tensors
        g8, g8_t = fp8_cast_transpose(grad_y, torch.float8_e5m2)
        grad_x = torch._scaled_mm(g8, w8_t.t(), scale_a=one, scale_b=one, out_dtype=grad_y.dtype)
        grad_w = torch._scaled_mm(g8_t, x8_t.t(), scale_a=one, scale_b=one, out_dtype=grad_y.dtype)
        grad_b = grad_y.sum(0) if ctx.has_bias else None     # TE fuses it into the cast-transpose
        return grad_x, grad_w, grad_b, None, None


def attn_values(probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """probs · V: (batch, l, l) × (batch, l, d)."""
    return torch.bmm(probs, v)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal fused attention on (b, heads, l, d) (flash kernels on GPU, torch's on CPU)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def rope_tables(tokens: int, d: int, device: torch.device, dtype: torch.dtype,
                positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (tokens, 1, d) for rotary embedding (GPT-NeoX rotate-half form)."""
    pos = torch.arange(tokens, device=device, dtype=torch.float32) if positions is None else positions.float()
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    freqs = torch.outer(pos, inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[:, None, :].to(dtype), emb.sin()[:, None, :].to(dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of one tensor x (tokens, heads, d)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """x (tokens, 2·width) → silu(gate) · up (tokens, width)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, 1e-5)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-5)


def res_add(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return x + residual


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, weight)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Megatron's vocab-parallel cross entropy on the local vocabulary shard.

    Same kernels as Megatron minus the two TP all-reduces (those are costed as MP collectives):
    max-subtract, exp, sum, gather of the target logit; backward is softmax − one-hot, computed
    from the saved softmax rather than by differentiating every step.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        logits_max = logits.max(dim=-1, keepdim=True)[0]
        shifted = logits - logits_max
        target_logit = shifted.gather(-1, target[:, None]).squeeze(-1)
        exp = shifted.exp_()
        sum_exp = exp.sum(dim=-1)
        loss = torch.log(sum_exp) - target_logit
        exp.div_(sum_exp[:, None])
        ctx.save_for_backward(exp, target)
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):  # type: ignore[override]
        softmax_, target = ctx.saved_tensors
        grad = softmax_.clone()
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, target] -= 1.0
        grad.mul_(grad_loss[:, None])
        return grad, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-token loss (tokens,) from logits (tokens, vocab shard), computed in fp32 as Megatron does."""
    return _VocabParallelCrossEntropy.apply(logits.float(), target)


class MasterAdam:
    """Adam on fp32 master weights with a half-precision model copy (mixed-precision training).

    One step = copy the model gradient into the fp32 master gradient, Adam on the master, copy the
    master back into the model parameters: what Megatron/DeepSpeed's optimizers do per step.
    With fp32 training there is no model copy and the gradient is the master's own.
    """

    def __init__(self, model_params: torch.Tensor, model_grad: torch.Tensor, lr: float = 1e-4):
        self.model = model_params
        self.model_grad = model_grad
        self.mixed = model_params.dtype != torch.float32
        if self.mixed:
            self.master = model_params.detach().float().clone()
            self.master.grad = torch.zeros_like(self.master)
        else:
            self.master = model_params
            self.master.grad = model_grad
        fused = model_params.is_cuda
        self.opt = torch.optim.Adam([self.master], lr=lr, fused=fused, foreach=None if fused else True)

    def step(self) -> None:
        with torch.no_grad():
            if self.mixed:
                self.master.grad.copy_(self.model_grad)
            self.opt.step()
            if self.mixed:
                self.model.copy_(self.master)


# ------------------------------------------------------------------------------- one operator
@dataclass
class Kernel:
    """An operator allocated at one shape: closures per direction, ready to be timed."""

    op: str
    shape: dict[str, int]
    precision: str
    device: str
    runs: dict[str, Callable[[], object]]        # direction -> callable

    def time(self, *, warmup: int, repeats: int, device_only: bool = False) -> dict[str, Timing]:
        """Time every direction of the operator (forward first, then backward / step); with
        ``device_only`` (CUDA) each call queued behind a device-side sleep of :data:`QUEUE_BEHIND_SECONDS`,
        so the host's issue time is not in the samples (calibrate.timing)."""
        behind = QUEUE_BEHIND_SECONDS if device_only and self.device == "cuda" else 0.0
        return {d: measure(fn, self.device, warmup=warmup, repeats=repeats, queue_behind_seconds=behind)
                for d, fn in self.runs.items()}


def _grad_closure(out: "torch.Tensor | tuple[torch.Tensor, ...]",
                  inputs: list[torch.Tensor]) -> Callable[[], object]:
    """The backward pass of a graph already built, repeatable (retain_graph)."""
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    grads = tuple(torch.randn_like(o) for o in outs)

    def bwd() -> object:
        return torch.autograd.grad(outs, inputs, grads, retain_graph=True)
    return bwd


def _rand(*shape: int, dtype: torch.dtype, device: torch.device, grad: bool = True,
          scale: float = 1.0) -> torch.Tensor:
    t = (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dtype)
    return t.requires_grad_(grad)


def fp8_gemms_supported(device: str) -> bool:
    """Whether ``device`` runs the FP8 GEMMs measured here (``torch._scaled_mm`` on E4M3 / E5M2):
    an NVIDIA GPU of compute capability 8.9 or later (Ada, Hopper and later), or a CPU, where
    torch runs them slowly (tests).  ROCm GPUs take other FP8 types (``fnuz``) and are left out."""
    if device == "cpu":
        return True
    return (device == "cuda" and torch.version.hip is None and torch.cuda.is_available()
            and torch.cuda.get_device_capability(0) >= (8, 9))


def _fp8_gemm_runs(m: int, k: int, n: int, dev: torch.device) -> dict[str, Callable[[], object]]:
    """One linear layer's GEMMs in FP8 with per-tensor scales, as Transformer Engine runs them.

    Forward: the E4M3 activation [m, k] times the E4M3 weight, a 16-bit (bf16) result with the bias
    fused.  Backward: dgrad (the E5M2 output gradient [m, n] times the weight) and wgrad (the
    gradient's transpose times the activation's), two GEMMs.  FP8 GEMMs on Hopper take their
    second operand column-major, which is why TE keeps transposed FP8 copies (its cast-transpose
    kernels): those copies are allocated here, and the casts themselves are costed apart
    (``predictor.fp8.layer_casts``), so only the GEMMs are timed.
    """
    if any(v % 16 for v in (m, k, n)):
        raise CalibrationError(f"FP8 GEMM m={m} k={k} n={n}: every dimension must be a multiple of 16")
    e4m3, e5m2, out = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16

    def fp8(rows: int, cols: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(rows, cols, device=dev, dtype=torch.float32) * scale).to(dtype)
    x, x_t = fp8(m, k, e4m3), fp8(k, m, e4m3)                 # activation and its transpose
    w, w_t = fp8(n, k, e4m3, 0.1), fp8(k, n, e4m3, 0.1)       # weight [n, k] and its transpose
    g, g_t = fp8(m, n, e5m2), fp8(n, m, e5m2)                 # output gradient and its transpose
    bias = torch.zeros(n, device=dev, dtype=out)
    one = torch.ones((), device=dev, dtype=torch.float32)

    def mm(a: torch.Tensor, b_col_major: torch.Tensor, **kw: object) -> torch.Tensor:
        return torch._scaled_mm(a, b_col_major, scale_a=one, scale_b=one, out_dtype=out, **kw)

    def fwd() -> object:
        return mm(x, w.t(), bias=bias)                        # [m, k] x [k, n]

    def bwd() -> object:
        return mm(g, w_t.t()), mm(g_t, x_t.t())               # dgrad [m, k]; wgrad [n, k]
    return {"fwd": fwd, "bwd": bwd}


def build_kernel(op: str, shape: Mapping[str, int], precision: str, device: str) -> Kernel:
    """Allocate operator ``op`` at ``shape`` (its catalog features) and return its closures.

    Raises :class:`CalibrationError` for an unknown operator, a missing feature or a precision
    that torch cannot run on this device.
    """
    if op not in OPERATORS:
        raise CalibrationError(f"unknown operator {op!r}")
    spec = OPERATORS[op]
    missing = [f for f in spec.features if f not in shape]
    if missing:
        raise CalibrationError(f"operator {op}: shape lacks features {missing}")
    if precision not in DTYPES and precision != "fp8":
        raise CalibrationError(f"unknown precision {precision!r}")
    s = {f: int(shape[f]) for f in spec.features}
    if any(v < 1 for v in s.values()):
        raise CalibrationError(f"operator {op}: every feature must be at least 1, got {s}")
    if precision == "fp8":
        # What Transformer Engine / torchao run in FP8; everything else stays 16-bit in an FP8 job.
        if op not in FP8_LINEARS:
            raise CalibrationError(f"operator {op}: FP8 is measured for the layers' linear GEMMs only "
                                   f"({', '.join(sorted(FP8_LINEARS))})")
        return Kernel(op, s, precision, device, _fp8_gemm_runs(s["m"], s["k"], s["n"], torch.device(device)))
    dt, dev = DTYPES[precision], torch.device(device)

    def fwd_bwd(forward: Callable[[], object], inputs: list[torch.Tensor]) -> dict[str, Callable]:
        out = forward()
        return {"fwd": lambda: forward(), "bwd": _grad_closure(out, inputs)}

    if spec.kind == "gemm":
        m, k, n = s["m"], s["k"], s["n"]
        x = _rand(m, k, dtype=dt, device=dev)
        w = _rand(n, k, dtype=dt, device=dev, scale=1.0 / math.sqrt(k))
        if op == "linear_final":
            # GPT-NeoX's output projection has no bias (and is the tied embedding with pp = 1).
            runs = fwd_bwd(lambda: linear(x, w, None), [x, w])
        else:
            b = _rand(n, dtype=dt, device=dev)
            runs = fwd_bwd(lambda: linear(x, w, b), [x, w, b])
    elif op in ("baddbmm", "bmm", "fillmask"):
        bt, l, d = s["batch"], s["l"], s["d"]
        if op == "bmm":
            probs = _rand(bt, l, l, dtype=dt, device=dev, scale=1.0 / l)
            v = _rand(bt, l, d, dtype=dt, device=dev)
            runs = fwd_bwd(lambda: attn_values(probs, v), [probs, v])
        else:
            q = _rand(bt, l, d, dtype=dt, device=dev)
            kk = _rand(bt, l, d, dtype=dt, device=dev)
            scale = 1.0 / math.sqrt(d)
            if op == "baddbmm":
                runs = fwd_bwd(lambda: qk_scores(q, kk, scale), [q, kk])
            else:
                mask = causal_mask(l, dev)
                runs = fwd_bwd(lambda: fill_mask_softmax(qk_scores(q, kk, scale), mask), [q, kk])
    elif op in ("softmax", "scaled_masked_softmax"):
        bt, l = s["batch"], s["l"]
        scores = _rand(bt, l, l, dtype=dt, device=dev)
        if op == "softmax":
            runs = fwd_bwd(lambda: softmax(scores), [scores])
        else:
            mask = causal_mask(l, dev)
            runs = fwd_bwd(lambda: scaled_masked_softmax(scores, 0.125, mask), [scores])
    elif op == "flash_atten" or op.startswith("flash_atten_"):
        # flash_atten: whatever SDPA picks; flash_atten_<impl>: that kernel (calibrate/attention.py).
        b_, h, l, d = s["b"], s["heads"], s["l"], s["d"]
        q, kk, v = (_rand(b_, h, l, d, dtype=dt, device=dev) for _ in range(3))
        fn = flash_attention if op == "flash_atten" else attention_kernel(op[len("flash_atten_"):])
        runs = fwd_bwd(lambda: fn(q, kk, v), [q, kk, v])
    elif op == "rope":
        t, h, d = s["tokens"], s["heads"], s["d"]
        # The catalog's rope is applied to queries and keys (4 tensor passes): both are timed.
        q = _rand(t, h, d, dtype=dt, device=dev)
        kk = _rand(t, h, d, dtype=dt, device=dev)
        cos, sin = rope_tables(t, d, dev, dt)
        runs = fwd_bwd(lambda: (rope(q, cos, sin), rope(kk, cos, sin)), [q, kk])
    elif op in ("gelu", "swiglu"):
        t, wdt = s["tokens"], s["width"]
        x = _rand(t, wdt * (2 if op == "swiglu" else 1), dtype=dt, device=dev)
        fn = gelu if op == "gelu" else swiglu
        runs = fwd_bwd(lambda: fn(x), [x])
    elif op in ("layernorm", "rmsnorm", "res_add"):
        t, dim = s["tokens"], s["dim"]
        x = _rand(t, dim, dtype=dt, device=dev)
        w = torch.ones(dim, dtype=dt, device=dev, requires_grad=True)
        if op == "layernorm":
            bias = torch.zeros(dim, dtype=dt, device=dev, requires_grad=True)
            runs = fwd_bwd(lambda: layernorm(x, w, bias), [x, w, bias])
        elif op == "rmsnorm":
            runs = fwd_bwd(lambda: rmsnorm(x, w), [x, w])
        else:
            r = _rand(t, dim, dtype=dt, device=dev)
            runs = fwd_bwd(lambda: res_add(x, r), [x, r])
    elif op == "embedding":
        t, dim, vocab = s["tokens"], s["dim"], s["vocab"]
        ids = torch.randint(0, vocab, (t,), device=dev)
        w = _rand(vocab, dim, dtype=dt, device=dev)
        runs = fwd_bwd(lambda: embedding(ids, w), [w])
    elif op == "cross_entropy":
        t, vocab = s["tokens"], s["vocab"]
        logits = _rand(t, vocab, dtype=dt, device=dev)
        target = torch.randint(0, vocab, (t,), device=dev)
        runs = fwd_bwd(lambda: vocab_parallel_cross_entropy(logits, target), [logits])
    elif op == "optimizer":
        n = s["params"]
        p = torch.zeros(n, dtype=dt, device=dev)
        g = (torch.randn(n, device=dev) * 1e-3).to(dt)
        opt = MasterAdam(p, g)
        runs = {"step": opt.step}
    else:  # pragma: no cover - the catalog grew an operator this module does not know
        raise CalibrationError(f"no torch kernel for operator {op!r}; calibrate/kernels.py needs one")
    if tuple(runs) != spec.directions:
        raise AssertionError(f"{op}: kernel directions {tuple(runs)} != catalog {spec.directions}")
    return Kernel(op, s, precision, device, runs)

