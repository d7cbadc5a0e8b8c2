"""What Megatron-core's overlapped communication changes in a prediction.

    python benchmarks/bench_overlap.py [--platform dgx-h100]

For Llama-3-shaped Megatron jobs (8B and 70B, layouts of the kind NeMo's recipes use, 8 to 1,024
GPUs) it prints the iteration with the data-parallel communication serial, with
--overlap-grad-reduce, and with --overlap-param-gather as well, the exposed reduction and gather
lines, what the overlaps hid (details.dp_hidden_seconds) and the bucket count per stage; then, for
the jobs with tensor parallelism, the iteration with --tp-comm-overlap added (Transformer Engine's
userbuffers), its exposed TP line and what it hid (details.tp_hidden_seconds).  Nothing here is
measured: it shows the mechanisms' size (predictor/overlap.py, predictor/tp_overlap.py,
docs/modelling.md §3).
"""
from __future__ import annotations

import argparse

from predictor import TrainingJob, load_platform, predict
from predictor.overlap import bucket_entries
from predictor.recipe import stage_parameter_counts

LLAMA3_8B = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336}
LLAMA3_70B = {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn_hidden": 28672}
COMMON = {"seq_len": 8192, "vocab": 128256, "norm": "rmsnorm", "activation": "swiglu",
          "attention": "flash", "pos_emb": "rotary", "tied_embeddings": False}
# (name, model, tp, pp, cp, virtual stages, GPUs, global batch)
CASES = (
    ("8B tp1 pp1 cp2", LLAMA3_8B, 1, 1, 2, 1, 8, 128),
    ("8B tp1 pp1 cp2", LLAMA3_8B, 1, 1, 2, 1, 128, 128),
    ("8B tp1 pp1 cp1", LLAMA3_8B, 1, 1, 1, 1, 1024, 1024),
    ("70B tp4 pp4 cp2 v5", LLAMA3_70B, 4, 4, 2, 5, 64, 128),
    ("70B tp4 pp4 cp2 v5", LLAMA3_70B, 4, 4, 2, 5, 1024, 512),
)


def _job(model, tp, pp, cp, v, gpus, batch, grad, param, tp_overlap=False) -> TrainingJob:
    dp = gpus // (tp * pp * cp)
    return TrainingJob.from_dict({
        "model": {**model, **COMMON},
        "layout": {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "virtual_stages": v, "micro_batch": 1,
                   "micro_batches": batch // dp, "zero_stage": 1, "recompute": "none",
                   "sequence_parallel": tp > 1, "overlap_grad_reduce": grad, "overlap_param_gather": param,
                   "tp_comm_overlap": tp_overlap},
        "run": {"precision": "bf16", "framework": "megatron", "fp8": "delayed"}})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--platform", default="dgx-h100")
    args = ap.parse_args()
    plat = load_platform(args.platform)
    print(f"platform {plat.name}; FP8 (delayed) Llama-3 jobs, seq 8192, micro-batch 1, distributed optimizer")
    print(f"{'job':<20}{'GPUs':>6}{'serial s':>10}{'+grad s':>9}{'+param s':>9}{'reduce':>8}"
          f"{'gather':>8}{'hidden':>8}{'buckets':>9}")
    for name, model, tp, pp, cp, v, gpus, batch in CASES:
        preds = [predict(_job(model, tp, pp, cp, v, gpus, batch, g, p), plat)
                 for g, p in ((False, False), (True, False), (True, True))]
        job = preds[2].job
        dp = job.layout.dp * job.layout.cp
        buckets = max(-(-n // bucket_entries(dp)) for n in stage_parameter_counts(job.model, job.layout))
        b = preds[2].breakdown
        print(f"{name:<20}{gpus:>6}{preds[0].iteration_seconds:>10.3f}{preds[1].iteration_seconds:>9.3f}"
              f"{preds[2].iteration_seconds:>9.3f}{b.gradient_reduce_seconds:>8.3f}"
              f"{b.optimizer_seconds:>8.3f}{preds[2].details.dp_hidden_seconds:>8.3f}{buckets:>9}")
    print("reduce / gather: the exposed gradient reduction and optimizer + parameter gather of the "
          "overlapped job; hidden: the data-parallel communication the overlaps hid")
    print()
    print(f"{'job':<20}{'GPUs':>6}{'+param s':>9}{'+tp s':>9}{'TP serial':>10}{'TP exposed':>11}{'hidden':>8}")
    for name, model, tp, pp, cp, v, gpus, batch in CASES:
        if tp == 1:
            continue
        base, ub = (predict(_job(model, tp, pp, cp, v, gpus, batch, True, True, t), plat) for t in (False, True))
        print(f"{name:<20}{gpus:>6}{base.iteration_seconds:>9.3f}{ub.iteration_seconds:>9.3f}"
              f"{base.breakdown.tp_allreduce_seconds:>10.3f}{ub.breakdown.tp_allreduce_seconds:>11.3f}"
              f"{ub.details.tp_hidden_seconds:>8.3f}")
    print("TP serial / exposed: the breakdown's TP communication line without and with --tp-comm-overlap "
          "(with it: what the chunked GEMMs and collectives add beyond the GEMMs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
