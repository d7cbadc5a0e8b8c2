"""The GPT job families perfcast's own measured runs train: the GPU family, its held-out jobs and the
FP8 pairs (their CPU stand-ins where the device is a CPU), as job dicts (``TrainingJob.from_dict``).

``benchmarks/bench_train_family.py`` trains them (calibrate/gpt_model.py), ``bench_gpu_stacks.py``
under other software stacks, ``profile_train_step.py`` under the profiler; the recorded runs are
benchmarks/data/h100-lent.  Torch-free: a family is data.
"""
from __future__ import annotations


def job_dict(layers: int, hidden: int, heads: int, seq: int, mb: int, m: int, *, vocab: int = 32000,
             attention: str = "flash", activation: str = "gelu", norm: str = "layernorm",
             precision: str = "bf16", dp: int = 1, fp8: str = "") -> dict:
    """One job of the families: pp = tp = 1, ZeRO-1, rotary, tied embeddings; ``mb`` sequences of
    ``seq`` tokens a micro-batch, ``m`` micro-batches a step."""
    return {
        "model": {"layers": layers, "hidden": hidden, "heads": heads, "seq_len": seq, "vocab": vocab,
                  "attention": attention, "activation": activation, "norm": norm, "pos_emb": "rotary",
                  "tied_embeddings": True},
        "layout": {"pp": 1, "tp": 1, "dp": dp, "micro_batch": mb, "micro_batches": m, "zero_stage": 1,
                   "recompute": "none"},
        "run": {"precision": precision, "train_iters": 0, "fp8": fp8},
        "cluster": {"gpus_per_node": dp},
    }


def heldout(device: str) -> list[tuple[str, dict]]:
    """Jobs kept out of every modelling decision: measured once, after the host model was built."""
    if device != "cuda":
        return [("h384 s128 mb2 L3", job_dict(3, 384, 6, 128, 2, 3, vocab=2048, attention="fused_softmax",
                                               precision="fp32"))]
    return [
        ("L6 h1536 s1024 mb2 m4 flash", job_dict(6, 1536, 12, 1024, 2, 4)),
        ("L3 h768 s2048 mb1 m8 fused_softmax", job_dict(3, 768, 12, 2048, 1, 8, attention="fused_softmax")),
        ("L12 h768 s1024 mb4 m2 flash", job_dict(12, 768, 12, 1024, 4, 2)),
        ("L4 h2560 s2048 mb2 m2 swiglu rmsnorm",
         job_dict(4, 2560, 20, 2048, 2, 2, activation="swiglu", norm="rmsnorm")),
        ("L2 h5120 s2048 mb2 m4 flash", job_dict(2, 5120, 40, 2048, 2, 4)),
        ("L24 h512 s512 mb1 m2 flash", job_dict(24, 512, 8, 512, 1, 2)),
        ("L4 h3072 s4096 mb1 m2 flash", job_dict(4, 3072, 24, 4096, 1, 2)),
        ("L10 h1024 s2048 mb2 m2 unfused", job_dict(10, 1024, 8, 2048, 2, 2, attention="unfused")),
        ("L6 h4096 s2048 mb1 m6 flash v50k", job_dict(6, 4096, 32, 2048, 1, 6, vocab=50257)),
    ]


def fp8_pairs(device: str) -> list[tuple[str, dict]]:
    """Jobs whose linear GEMMs run in FP8 (delayed scaling, calibrate.kernels.Fp8Linear), each
    with its 16-bit twin measured beside it: the FP8 GEMM samples and cast costs checked on real
    steps.  Measured after the FP8 samples were fitted; no modelling choice looked at them."""
    shapes = [("L4 h2048 s2048 mb2", (4, 2048, 16, 2048, 2, 2), {}),
              ("L4 h4096 s2048 mb1 swiglu rmsnorm", (4, 4096, 32, 2048, 1, 2),
               {"activation": "swiglu", "norm": "rmsnorm"}),
              ("L4 h4096 s4096 mb2", (4, 4096, 32, 4096, 2, 2), {}),
              ("L4 h6144 s2048 mb2", (4, 6144, 48, 2048, 2, 2), {}),
              ("L2 h8192 s2048 mb2 m4", (2, 8192, 64, 2048, 2, 4), {}),
              ("L8 h1024 s1024 mb1 m4", (8, 1024, 16, 1024, 1, 4), {})]
    if device != "cuda":
        shapes = [("L2 h256 s64 mb2", (2, 256, 4, 64, 2, 2), {"vocab": 1024})]
    out = []
    for name, args, kw in shapes:
        out.append((f"{name} fp8", job_dict(*args, fp8="delayed", **kw)))
        out.append((f"{name} bf16", job_dict(*args, **kw)))
    return out


def family(device: str) -> list[tuple[str, dict]]:
    """The jobs measured on ``device``: host-bound to device-bound, both attention kinds."""
    out: list[tuple[str, dict]] = []
    if device == "cuda":
        for hidden, heads in ((512, 8), (1024, 16), (2048, 16), (4096, 32)):
            for mb in (1, 4):
                for seq in (1024, 2048):
                    out.append((f"h{hidden} s{seq} mb{mb} flash",
                                job_dict(4, hidden, heads, seq, mb, 2)))
        for hidden, heads in ((1024, 16), (2048, 16)):
            for mb in (1, 2):
                out.append((f"h{hidden} s1024 mb{mb} fused_softmax",
                            job_dict(4, hidden, heads, 1024, mb, 2, attention="fused_softmax")))
        for hidden, heads in ((1024, 8), (2048, 16), (4096, 32)):
            out.append((f"h{hidden} s2048 mb2 swiglu rmsnorm",
                        job_dict(4, hidden, heads, 2048, 2, 2, activation="swiglu", norm="rmsnorm")))
        for layers in (2, 8, 16):
            out.append((f"L{layers} h1024 s1024 mb1 flash", job_dict(layers, 1024, 16, 1024, 1, 4)))
        # Device-bound shapes nearer production: wider layers, more accumulation, longer sequences.
        out += [("L2 h8192 s2048 mb1 flash", job_dict(2, 8192, 64, 2048, 1, 2)),
                ("L4 h6144 s2048 mb2 flash", job_dict(4, 6144, 48, 2048, 2, 2)),
                ("L8 h4096 s4096 mb1 flash m4", job_dict(8, 4096, 32, 4096, 1, 4)),
                ("L8 h2048 s2048 mb8 flash", job_dict(8, 2048, 16, 2048, 8, 2)),
                ("L6 h3072 s2048 mb2 fused_softmax",
                 job_dict(6, 3072, 24, 2048, 2, 2, attention="fused_softmax")),
                ("L4 h5120 s4096 mb1 swiglu rmsnorm",
                 job_dict(4, 5120, 40, 4096, 1, 2, activation="swiglu", norm="rmsnorm")),
                ("L8 h4096 s2048 mb4 swiglu rmsnorm m8",
                 job_dict(8, 4096, 32, 2048, 4, 8, activation="swiglu", norm="rmsnorm"))]
        return out
    # CPU: fp32, small enough to run in seconds on two cores.
    for hidden, heads in ((128, 2), (256, 4), (512, 8)):
        for mb in (1, 4):
            out.append((f"h{hidden} s128 mb{mb}", job_dict(2, hidden, heads, 128, mb, 2, vocab=2048,
                                                            attention="fused_softmax", precision="fp32")))
    return out


#: ``bench_gpu_stacks.py --jobs``: the jobs its stacks part trains.
JOB_SETS = ("family", "host-series", "long-seq", "heldout")


def job_set(which: str, device: str) -> list[tuple[str, dict]]:
    """The jobs of ``which`` (:data:`JOB_SETS`) on ``device``."""
    if which not in JOB_SETS:
        raise ValueError(f"job set {which!r}: not one of {', '.join(JOB_SETS)}")
    if which == "family":
        return family(device)
    if which == "heldout":
        # Stack validation: the held-out jobs, which no stack's modelling has seen, plus two long
        # sequences at lengths and widths no earlier call measured (12k and 24k tokens).
        extra = ([] if device != "cuda" else
                 [("L3 h2560 s12288 mb1 m2 flash", job_dict(3, 2560, 20, 12288, 1, 2)),
                  ("L2 h3072 s24576 mb1 m2 flash", job_dict(2, 3072, 24, 24576, 1, 2))])
        return heldout(device) + extra
    if which == "host-series":
        # Host-bound: the step's slope in depth is the per-layer cost, its slope in micro-batches
        # at fixed depth the per-micro-batch cost, what is left the per-step cost.
        return [(f"L{layers} h1024 s1024 mb1 m{m} flash", job_dict(layers, 1024, 16, 1024, 1, m))
                for layers in (2, 8, 16) for m in (1, 4)]
    # Long sequences, where attention's s^2 dominates: one shape at 2k-32k, a wider one at 8k-16k.
    return ([(f"L4 h2048 s{seq} mb1 m2 flash", job_dict(4, 2048, 16, seq, 1, 2))
             for seq in (2048, 8192, 16384, 32768)]
            + [(f"L2 h4096 s{seq} mb1 m2 flash", job_dict(2, 4096, 32, seq, 1, 2)) for seq in (8192, 16384)])


def quick_jobs() -> list[tuple[str, dict]]:
    """Two tiny fp32 jobs for a smoke run of the stacks on a CPU (``bench_gpu_stacks.py --quick``)."""
    return [("L2 h64 s64", job_dict(2, 64, 4, 64, 2, 2, vocab=512, precision="fp32")),
            ("L2 h64 s64 softmax", job_dict(2, 64, 4, 64, 1, 2, vocab=512, precision="fp32",
                                            attention="fused_softmax"))]
