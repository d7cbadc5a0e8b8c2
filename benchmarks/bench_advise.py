"""How fast is perf-advise?  Full layout search at 1024 GPUs with every knob free.

    python benchmarks/bench_advise.py [--platform perlmutter-a100] [--gpus 1024] [--repeat 3]

Target: ≤ 1 s for the search on a 2-core machine, platform loading excluded (the daemon
and a CLI run load a platform once).  Prints, per model: layouts meeting the launch constraints,
how many fit, the time of enumeration + memory filter, of the one batched ``predict_many`` call,
of the whole ``advise()``, and — for scale — what predicting the same candidates one at a time
with ``predict()`` would cost (timed on a sample, extrapolated).  Every call goes through one
:class:`predictor.Predictor` kept for the platform (as a daemon would keep it), so the repeats
after the first reuse its costed shapes; ``cold`` is one ``advise()`` with a new Predictor (what
a perf-advise command pays).
"""
from __future__ import annotations

import argparse
import time

from predictor import Predictor, TrainingJob, load_platform
from predictor.advise import SearchOptions, _job_for, _plan, advise, sweep

MODELS = {
    # name: (model keys, global batch in sequences)
    "GPT-3 175B": ({"layers": 96, "hidden": 12288, "heads": 96, "seq_len": 2048}, 1536),
    "GPT-NeoX 20B": ({"layers": 44, "hidden": 6144, "heads": 64, "seq_len": 2048,
                      "parallel_residual": True}, 1024),
    "Llama-3 8B (GQA, SwiGLU, flash)": ({"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
                                         "ffn_hidden": 14336, "activation": "swiglu",
                                         "norm": "rmsnorm", "attention": "flash",
                                         "vocab": 128256, "seq_len": 4096}, 1024),
}


def make_job(model: dict, global_batch: int, gpn: int) -> TrainingJob:
    return TrainingJob.from_dict({
        "model": model,
        "layout": {"pp": 8, "tp": 4, "dp": 4, "micro_batch": 1, "micro_batches": global_batch // 4,
                   "zero_stage": 1, "recompute": "full"},
        "run": {"precision": "bf16", "train_iters": 10_000},
        "cluster": {"gpus_per_node": gpn},
    })


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--platform", default="perlmutter-a100")
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--one-by-one-sample", type=int, default=20)
    args = ap.parse_args()

    t = time.perf_counter()
    plat = load_platform(args.platform)
    print(f"load_platform({args.platform!r}): {time.perf_counter() - t:.2f} s (once per process)")
    held = Predictor(plat)

    def predict_many(jobs, _platform=None):
        return held.predict_many(jobs)
    gpn = plat.gpus_per_node
    opts = SearchOptions(gpus=args.gpus)
    print(f"\nfull search, {args.gpus} GPUs ({args.gpus // gpn} nodes of {gpn}), every knob free, "
          f"best of {args.repeat}")
    print(f"{'model':34} {'layouts':>7} {'fit':>5} {'enum+mem':>9} {'predict':>8} {'advise()':>9} "
          f"{'cold':>7} {'one-by-one':>11}  best")
    worst = 0.0
    for name, (model, gb) in MODELS.items():
        job = make_job(model, gb, gpn)
        plan = _plan(job, plat, args.gpus, opts)
        jobs = [_job_for(job, lay, gpn) for lay, _ in plan.fitting]
        t_plan = best_of(lambda: _plan(job, plat, args.gpus, opts), args.repeat)
        t_pred = best_of(lambda: predict_many(jobs, plat), args.repeat)
        t_all = best_of(lambda: advise(job, plat, opts, predict_many), args.repeat)
        t_cold = best_of(lambda: advise(job, plat, opts), 1)
        sample = jobs[:args.one_by_one_sample]
        t_one = best_of(lambda: [held.predict(j) for j in sample], 1) / max(len(sample), 1) * len(jobs)
        adv = advise(job, plat, opts, predict_many)
        b = adv.best
        best = (f"{b.name} mb{b.layout.micro_batch} {b.layout.recompute} z{b.layout.zero_stage} "
                f"v{b.layout.virtual_stages}: {b.iteration_seconds:.2f} s/iteration, MFU {100 * b.mfu:.0f}%"
                if b else "none fits")
        print(f"{name:34} {plan.enumerated:7d} {len(plan.fitting):5d} {t_plan:8.3f}s {t_pred:7.3f}s "
              f"{t_all:8.3f}s {t_cold:6.3f}s {t_one:10.1f}s  {best}")
        worst = max(worst, t_all)
    print(f"\nslowest full search: {worst:.3f} s (target ≤ 1 s)")

    job = make_job(*MODELS["GPT-NeoX 20B"], gpn)
    counts = [c for c in (64, 128, 256, 512, 1024) if c % gpn == 0]
    t = best_of(lambda: sweep(job, plat, counts, SearchOptions(), predict_many), args.repeat)
    print(f"sweep over {counts} GPUs (GPT-NeoX 20B), one batched call: {t:.3f} s")


if __name__ == "__main__":
    main()
