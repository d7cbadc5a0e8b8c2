"""A GPT-NeoX-shaped model built from the calibrated kernels, trained for real to check a prediction.

The model runs exactly the operators of :mod:`calibrate.kernels` at the shapes the predictor's
decomposition queries (embedding, per layer 2 norms, QKV, rotary on q and k, QKᵀ / causal
softmax / ·V (or flash attention), output projection, 2 residual adds, MLP up, activation, MLP
down; final norm, tied output projection, vocab-parallel cross entropy), then a data-parallel
step the way DeepSpeed does it: gradients accumulate into one flat buffer, one all-reduce over
the DP group, Adam on fp32 master weights (ZeRO-1: on this rank's shard, then an all-gather of
the updated parameters).

Supported: pp = 1, tp = 1, any dp (local processes, gloo on CPU / NCCL on GPUs), ZeRO 0 and 1,
no recomputation; :class:`RecomputeGPT` (what :func:`measure_training` uses for such jobs) also
full recomputation (each layer checkpointed, its forward run again in the backward, as Megatron's
``--recompute-granularity full --recompute-method uniform``).  Anything else is refused (the check would not be like for like).
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.checkpoint import checkpoint

from predictor.recipe import linear_bias, mlp_up_width, vocab_per_rank
from predictor.job import TrainingJob

from . import kernels as K
from .collectives import free_port, spawn_until_result
from .errors import CalibrationError
from .timing import robust_seconds, time_steps


def check_supported(job: TrainingJob, recompute: tuple[str, ...] = ("none",)) -> None:
    """Refuse jobs this model cannot run like for like, naming the key (``recompute``: the
    recomputation modes accepted; :class:`RecomputeGPT` runs ``full`` as well)."""
    m, lay = job.model, job.layout
    problems = []
    if lay.pp != 1:
        problems.append(f"layout.pp = {lay.pp} (only 1)")
    if lay.tp != 1:
        problems.append(f"layout.tp = {lay.tp} (only 1)")
    if lay.zero_stage > 1:
        problems.append(f"layout.zero_stage = {lay.zero_stage} (0 or 1)")
    if lay.recompute not in recompute:
        problems.append(f"layout.recompute = {lay.recompute!r} (only {' or '.join(map(repr, recompute))})")
    if lay.sequence_parallel or lay.virtual_stages != 1:
        problems.append("sequence parallelism / virtual stages")
    if m.kv_heads != m.heads:
        problems.append("GQA (kv_heads != heads)")
    if m.parallel_residual:
        problems.append("parallel residual")
    if not m.tied_embeddings:
        problems.append("untied embeddings")
    if m.pos_emb == "alibi":
        problems.append("alibi")
    if job.run.fp8 not in ("", "delayed"):
        problems.append(f"run.fp8 = {job.run.fp8!r} (only delayed scaling)")
    if job.run.fp8 and lay.recompute != "none":
        problems.append("run.fp8 with recomputation")
    if problems:
        raise CalibrationError("the real-training check supports only: " + "; ".join(problems))


class FlatGPT:
    """The model's parameters as views of one flat buffer, gradients as views of another."""

    RECOMPUTE: tuple[str, ...] = ("none",)

    def __init__(self, job: TrainingJob, device: str, dp: int, seed: int = 0):
        check_supported(job, self.RECOMPUTE)
        self.job = job
        m = job.model
        self.device = torch.device(device)
        self.dtype = K.DTYPES[job.run.precision]
        self.h, self.heads, self.d = m.hidden, m.heads, m.head_dim
        self.seq, self.mb = m.seq_len, job.layout.micro_batch
        self.vocab = vocab_per_rank(m.vocab, 1)
        self.ffn = m.ffn_hidden
        self.bias = linear_bias(m)          # the recipe's rule, so the model is the one predicted
        up = mlp_up_width(m)
        shapes: list[tuple[str, tuple[int, ...]]] = [("emb", (self.vocab, self.h))]
        for i in range(m.layers):
            shapes += [(f"{i}.ln1_w", (self.h,))] + ([(f"{i}.ln1_b", (self.h,))] if self.bias else [])
            shapes += [(f"{i}.qkv_w", (3 * self.h, self.h))] + ([(f"{i}.qkv_b", (3 * self.h,))] if self.bias else [])
            shapes += [(f"{i}.out_w", (self.h, self.h))] + ([(f"{i}.out_b", (self.h,))] if self.bias else [])
            shapes += [(f"{i}.ln2_w", (self.h,))] + ([(f"{i}.ln2_b", (self.h,))] if self.bias else [])
            shapes += [(f"{i}.up_w", (up, self.h))] + ([(f"{i}.up_b", (up,))] if self.bias else [])
            shapes += [(f"{i}.down_w", (self.h, self.ffn))] + ([(f"{i}.down_b", (self.h,))] if self.bias else [])
        shapes += [("lnf_w", (self.h,))] + ([("lnf_b", (self.h,))] if self.bias else [])
        self.numel = sum(math.prod(s) for _, s in shapes)
        # Padded to a multiple of dp so that ZeRO-1 shards are equal (DeepSpeed pads the same way).
        self.padded = math.ceil(self.numel / dp) * dp
        gen = torch.Generator().manual_seed(seed)
        init = torch.randn(self.padded, generator=gen) * 0.02
        self.flat = init.to(device=self.device, dtype=self.dtype)
        self.flat_grad = torch.zeros_like(self.flat)
        self.params: dict[str, torch.Tensor] = {}
        off = 0
        for name, shape in shapes:
            n = math.prod(shape)
            p = torch.nn.Parameter(self.flat[off:off + n].view(shape))
            if name.endswith("ln1_w") or name.endswith("ln2_w") or name == "lnf_w":
                with torch.no_grad():
                    p.fill_(1.0)
            p.grad = self.flat_grad[off:off + n].view(shape)
            self.params[name] = p
            off += n
        self.fp8 = bool(job.run.fp8)
        self._w8: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        if self.fp8:
            dims = {"tokens (seq_len x micro_batch)": self.seq * self.mb, "hidden": self.h,
                    "ffn width": self.ffn, "MLP up width": up}
            odd = [f"{k} = {v}" for k, v in dims.items() if v % 16]
            if odd:
                raise CalibrationError("run.fp8: FP8 GEMMs need every dimension a multiple of 16; "
                                       + ", ".join(odd))
        self.mask = K.causal_mask(self.seq, self.device)
        # (s, b) token order as Megatron: token t sits at position t // b.
        pos = torch.arange(self.seq, device=self.device).repeat_interleave(self.mb)
        self.cos, self.sin = K.rope_tables(self.seq * self.mb, self.d, self.device, self.dtype, pos)

    def _p(self, name: str) -> torch.Tensor | None:
        return self.params.get(name)

    def begin_step(self) -> None:
        """A new training step: the weights changed, so their FP8 copies are cast again."""
        self._w8.clear()

    def _linear(self, x: torch.Tensor, i: int, name: str) -> torch.Tensor:
        """A layer's linear (``name``: qkv | out | up | down) in 16 bits, or in FP8 (run.fp8) with
        the weight cast once per step, as Transformer Engine does."""
        w, b = self.params[f"{i}.{name}_w"], self._p(f"{i}.{name}_b")
        if not self.fp8:
            return K.linear(x, w, b)
        key = f"{i}.{name}"
        if key not in self._w8:
            with torch.no_grad():
                self._w8[key] = K.fp8_cast_transpose(w, torch.float8_e4m3fn)
        return K.Fp8Linear.apply(x, w, b, *self._w8[key])

    def _norm(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return K.layernorm(x, w, b) if self.job.model.norm == "layernorm" else K.rmsnorm(x, w)

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s, b, hh, d = self.seq, self.mb, self.heads, self.d
        kind = self.job.model.attention
        if kind == "flash":
            def to_bhsd(t: torch.Tensor) -> torch.Tensor:
                return t.view(s, b, hh, d).permute(1, 2, 0, 3)
            ctx = K.flash_attention(to_bhsd(q), to_bhsd(k), to_bhsd(v))     # (b, heads, s, d)
            return ctx.permute(2, 0, 1, 3).reshape(s * b, hh * d)

        def to_bsd(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(s, b * hh, d).transpose(0, 1)                   # (b·heads, s, d)
        qb, kb, vb = to_bsd(q), to_bsd(k), to_bsd(v)
        scale = 1.0 / math.sqrt(d)
        if kind == "fused_softmax":
            probs = K.scaled_masked_softmax(K.qk_scores(qb, kb, scale), 1.0, self.mask)
        else:
            probs = K.fill_mask_softmax(K.qk_scores(qb, kb, scale), self.mask)
        ctx = K.attn_values(probs, vb)                                       # (b·heads, s, d)
        return ctx.transpose(0, 1).reshape(s * b, hh * d)

    def _layer(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """One transformer layer's forward on the (s·b, h) activations."""
        m = self.job.model
        P = self._p
        t = x.shape[0]
        ln = self._norm(x, P(f"{i}.ln1_w"), P(f"{i}.ln1_b"))
        qkv = self._linear(ln, i, "qkv").view(t, self.heads, 3, self.d)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        if m.pos_emb == "rotary":
            q, k = K.rope(q, self.cos, self.sin), K.rope(k, self.cos, self.sin)
        ctx = self._attention(q, k, v)
        x = K.res_add(self._linear(ctx, i, "out"), x)
        ln = self._norm(x, P(f"{i}.ln2_w"), P(f"{i}.ln2_b"))
        u = self._linear(ln, i, "up")
        a = K.gelu(u) if m.activation == "gelu" else K.swiglu(u)
        return K.res_add(self._linear(a, i, "down"), x)

    def loss(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward pass of one micro-batch; ids/targets are (s·b,) in (s, b) order."""
        m = self.job.model
        P = self._p
        x = K.embedding(ids, self.params["emb"])
        full = self.job.layout.recompute == "full"
        for i in range(m.layers):
            if full:
                # Megatron's full recomputation (uniform, one layer per checkpoint): the forward
                # keeps only each layer's input; the backward runs the layer's forward again.
                x = checkpoint(self._layer, i, x, use_reentrant=False)
            else:
                x = self._layer(i, x)
        x = self._norm(x, self.params["lnf_w"], P("lnf_b"))
        logits = K.linear(x, self.params["emb"], None)                       # tied output projection
        return K.vocab_parallel_cross_entropy(logits, targets).mean()


class RecomputeGPT(FlatGPT):
    """:class:`FlatGPT` that also runs ``layout.recompute = "full"``: each layer checkpointed
    (``torch.utils.checkpoint``, non-reentrant), its forward run again in the backward."""

    RECOMPUTE = ("none", "full")


def model_class(job: TrainingJob) -> type[FlatGPT]:
    """The model that runs ``job`` (full recomputation needs :class:`RecomputeGPT`)."""
    return RecomputeGPT if job.layout.recompute == "full" else FlatGPT


@dataclass
class TrainMeasurement:
    """Measured seconds per training iteration (slowest rank; calibrate.timing.robust_seconds over steps)."""

    iteration_seconds: float
    steps: list[float]
    ranks: int
    params: int
    threads: int
    device: str

    def to_dict(self) -> dict[str, Any]:
        return {"iteration_seconds": self.iteration_seconds, "steps": self.steps, "ranks": self.ranks,
                "params": self.params, "threads": self.threads, "device": self.device}


@dataclass
class RankState:
    """One training rank: its model, its optimizer over master weights ``flat[lo:hi]`` (ZeRO-1
    with dp > 1: its shard, gathered back after each step), and its micro-batches of token ids."""

    model: Any
    optimizer: Any
    batches: list
    zero: bool
    lo: int
    hi: int


def rank_state(job: TrainingJob, device: str, world: int, rank: int) -> RankState:
    """Build :class:`RankState` for ``rank`` of ``world`` on ``device``."""
    dev = f"cuda:{rank}" if device == "cuda" else "cpu"
    model = model_class(job)(job, dev, world, seed=0)
    zero = job.layout.zero_stage >= 1 and world > 1
    shard = model.padded // world
    lo = rank * shard if zero else 0
    hi = lo + shard if zero else model.padded
    opt = K.MasterAdam(model.flat[lo:hi], model.flat_grad[lo:hi])
    return RankState(model, opt, token_batches(job, dev, rank), zero, lo, hi)


def token_batches(job: TrainingJob, device: str, rank: int = 0) -> list:
    """Each micro-batch's (token ids, targets) of ``rank``, (s·b,) each, drawn from a fixed seed."""
    gen = torch.Generator().manual_seed(1234 + rank)
    tokens = job.model.seq_len * job.layout.micro_batch
    return [(torch.randint(0, job.model.vocab, (tokens,), generator=gen).to(device),
             torch.randint(0, job.model.vocab, (tokens,), generator=gen).to(device))
            for _ in range(job.layout.micro_batches)]


def _train_worker(rank: int, world: int, port: int, job_dict: dict, device: str, threads: int,
                  steps: int, warmup: int, results) -> None:
    warnings.filterwarnings("ignore")
    if threads:
        torch.set_num_threads(threads)
    job = TrainingJob.from_dict(job_dict)
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        if device == "cuda":
            torch.cuda.set_device(rank)
        dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world)
    try:
        st = rank_state(job, device, world, rank)
        model, opt, batches, zero, lo, hi = st.model, st.optimizer, st.batches, st.zero, st.lo, st.hi

        def step() -> None:
            model.flat_grad.zero_()
            model.begin_step()
            for ids, tgt in batches:
                model.loss(ids, tgt).backward()
            if world > 1:
                dist.all_reduce(model.flat_grad)
                model.flat_grad.div_(world)
            opt.step()
            if zero:
                dist.all_gather_into_tensor(model.flat, model.flat[lo:hi].clone())

        times = time_steps(step, steps, warmup, device, before=dist.barrier if world > 1 else None)
        # A step ends when its slowest rank does.
        per = torch.tensor(times, dtype=torch.float64)
        if world > 1:
            dist.all_reduce(per, op=dist.ReduceOp.MAX)
        if rank == 0:
            results.put((per.tolist(), model.numel))
        if world > 1:
            # No rank tears gloo down while another still talks to it (a rank that does can abort
            # with "terminate called without an active exception").
            dist.barrier()
    finally:
        if world > 1:
            dist.destroy_process_group()


def measure_training(job: TrainingJob, *, device: str = "cpu", steps: int = 8, warmup: int = 2,
                     threads: int = 0, timeout_s: float = 900.0) -> TrainMeasurement:
    """Train ``job`` for ``warmup + steps`` iterations on dp local processes and time them."""
    check_supported(job, RecomputeGPT.RECOMPUTE)
    world = job.layout.dp
    if device == "cuda" and torch.cuda.device_count() < world:
        raise CalibrationError(f"dp = {world} needs {world} local GPUs")
    if device == "cpu":
        threads = threads or max(1, (os.cpu_count() or 1) // world)
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    args = (world, free_port(), job.to_dict(), device, threads, steps, warmup, results)
    if world == 1:
        _train_worker(0, *args)
    else:
        # Rank 0 sends the result only after every rank has measured every step.
        spawn_until_result(_train_worker, args, world, results, timeout_s=timeout_s, what="training rank")
    times, numel = results.get()
    return TrainMeasurement(robust_seconds(times, device), times, world, int(numel), threads, device)
