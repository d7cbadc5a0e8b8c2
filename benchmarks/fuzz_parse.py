"""Fuzz parse_script with mutations of the test corpus and random scripts.

    python benchmarks/fuzz_parse.py [--n 10000] [--seed 1]
    python benchmarks/fuzz_parse.py --n 100000 --seed 424242     # the release run (issue 32)

Every 20th script is a hostile shape (a megabyte-long #SBATCH line, hundreds of thousands of
directives, deeply nested arithmetic, a command of a million words, a huge here-document): each
must end within the parse deadline (80 ms) plus a few milliseconds, with an answer.

A crash is: an exception out of parse_script, an 'internal parser error' answer (a caught bug),
or an error that is not one line starting with 'cannot predict: '. Prints the crash count (target
0), the slowest script and the time distribution.
"""
from __future__ import annotations

import argparse
import logging
import pathlib
import random
import statistics
import sys
import time

from slurm_plugin.launch import parse_script

ROOT = pathlib.Path(__file__).resolve().parent.parent

log = logging.getLogger("fuzz_parse")
CORPUS = ROOT / "tests" / "launch" / "data" / "corpus"
TOKENS = ["$", "${", "}", "$(", ")", "$((", "))", "'", '"', "`", "\\", "\n", " ", "|", "&&", "||", ";", "&",
          "<<EOF\n", "\nEOF\n", "<<-EOT\n", "if [ $X = 1 ]; then ", "fi", "for i in 1 2; do ", "done",
          "case $X in a) ", ";;", "esac", "while true; do ", "f() { ", "}", "( ", "[[ ", " ]]", "#",
          "srun ", "python ", "pretrain_gpt.py ", "deepy.py ", "train.py ", "--num-layers ", "--hidden-size ",
          "--micro-batch-size ", "deepspeed ", "torchrun ", "--nnodes ", "source ", "eval ", "bash -c ",
          "A=( ", "${A[@]}", "${X:-", "${X//_}", "export X=", "#SBATCH --nodes=", "#SBATCH --gres=gpu:",
          "\x00", "\ue000", "\udcff", "1", "8", "-1", "99999999999999999999", "*", "~", "=", ":",
          # shell forms around launches: quoted arrays into -c strings, heredoc commands, argument files
          '"${A[*]}"', '"${A[@]}"', "read -r -d '' cmd <<EOF\n", 'bash -c "$cmd"', "sh -c ", "$(cat ",
          "$(< ", "cd /opt/x && ", "--no-container-mount-home ", "--container-image=",
          # Megatron-core / MoE flags
          "--num-experts ", "--moe-router-topk ", "--context-parallel-size ", "--attention-backend ",
          "--recompute-granularity full ", "--recompute-method block ", "--fp8-format hybrid ",
          "--num-virtual-stages-per-pipeline-rank ",
          # values no script means: integers past Python's 4,300-digit limit, lone surrogates
          "9" * 4400, "${" + "9" * 4400 + "}", "A=([" + "9" * 4400 + "]=x) ", "[training]\nsteps = ",
          "cat > c.json <<EOF\n{\"train_batch_size\": \"\udcff\"}\nEOF\n", "\ud800",
          # NeMo (Hydra) and NeMo 2.0
          "megatron_gpt_pretraining.py ", "--config-path=", "--config-name=", "trainer.num_nodes=",
          "+model.num_moe_experts=", "~model.optim ", "model.tensor_model_parallel_size=", "nemo llm pretrain ",
          # TorchTitan
          "-m torchtitan.train ", "--job.config_file ", "--training.steps ", "--parallelism.tensor_parallel_degree="]


def mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        n = len(text)
        i = rng.randrange(n + 1)
        j = min(n, i + rng.randint(0, 80))
        if op == 0:
            text = text[:i] + text[j:]                                  # delete a span
        elif op == 1:
            text = text[:i] + text[i:j] * rng.randint(2, 4) + text[i:]  # duplicate a span
        elif op == 2:
            text = text[:i] + rng.choice(TOKENS) + text[i:]             # insert a shell token
        elif op == 3:
            lines = text.split("\n")
            rng.shuffle(lines)
            text = "\n".join(lines)                                     # shuffle lines
        elif op == 4:
            text = text[:i]                                             # truncate
        elif op == 5 and n:
            text = text[:i] + chr(rng.randrange(1, 0x3000)) + text[i + 1:]  # replace a character
        else:
            k = rng.randrange(n + 1)
            text = text[:i] + text[k:k + 40] + text[i:]                 # splice a piece elsewhere
    return text


def random_script(rng: random.Random) -> str:
    return "#!/bin/bash\n" + "".join(rng.choice(TOKENS) for _ in range(rng.randint(1, 120)))


_LAUNCH = ("srun python pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 2 "
           "--seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8\n")


def hostile_script(rng: random.Random) -> str:
    """One of the shapes that stalled the daemon before its parser was bounded."""
    head = "#!/bin/bash\n#SBATCH --nodes=1 --gpus-per-node=8\n"
    size = rng.choice((1 << 16, 1 << 20, 3 << 20))
    kind = rng.randrange(9)
    if kind == 0:
        body = "#SBATCH --comment=" + "x" * size + "\n"
    elif kind == 1:
        body = "#SBATCH -N 1\n" * (size // 12)
    elif kind == 2:
        body = "#SBATCH" + " -N 1" * (size // 5) + "\n"
    elif kind == 3:
        depth = rng.choice((100, 2_000, 20_000))
        body = "X=" + "$((" * depth + "1" + "))" * depth + "\n"
    elif kind == 4:
        body = "echo " + "a " * (size // 2) + "\n"
    elif kind == 5:
        body = "cat <<EOF\n" + "line\n" * (size // 5) + "EOF\n"
    elif kind == 7:
        # a huge command read from a here-document and run through bash -c
        body = "read -r -d '' cmd <<EOF\n" + "--x 1 \\\n" * (size // 8) + "EOF\nbash -c \"$cmd\"\n"
    elif kind == 8:
        # a big array joined into one -c string
        body = "A=(" + " --y 2" * (size // 6) + ")\nsrun bash -c \"python pretrain_gpt.py ${A[*]}\"\n"
    else:
        body = 'X="' + "a\\\"" * (size // 3) + '"\n'
    return head + body + _LAUNCH


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("slurm_plugin").setLevel(logging.CRITICAL)
    rng = random.Random(args.seed)
    cases = [(p, (p / "job.sbatch").read_text()) for p in sorted(CORPUS.iterdir()) if (p / "job.sbatch").exists()]
    crashes: list = []
    times: list = []
    hostile_times: list = []
    slowest = (0.0, "")
    outcomes = {"job": 0, "cannot predict": 0}
    for k in range(args.n):
        hostile = k % 20 == 19
        if hostile:
            case, text = None, hostile_script(rng)
        elif k % 4 == 3:
            case, text = None, random_script(rng)
        else:
            case, base = rng.choice(cases)
            text = mutate(base, rng)
        t = time.perf_counter()
        try:
            res = parse_script(str(case / "job.sbatch") if case else "random.sbatch", text,
                               work_dir=str(case) if case else "/nonexistent")
            bad = None
            if res.error is not None:
                if not res.error.startswith("cannot predict: ") or "\n" in res.error:
                    bad = f"malformed error {res.error[:100]!r}"
                elif "internal parser error" in res.error:
                    bad = res.error
            elif res.job is None:
                bad = "no job and no error"
        except BaseException as exc:  # noqa: BLE001 - counting crashes is the point
            bad = f"{type(exc).__name__}: {exc}"
            res = None
        dt = time.perf_counter() - t
        (hostile_times if hostile else times).append(dt)
        if dt > slowest[0]:
            slowest = (dt, f"{case.name if case else 'random'} #{k}")
        if bad:
            crashes.append((k, case.name if case else "random", bad, text))
        elif res is not None:
            outcomes["job" if res.job is not None else "cannot predict"] += 1
    log.info("fuzz: %d scripts (seed %d): %d predicted, %d cannot predict", args.n, args.seed,
             outcomes["job"], outcomes["cannot predict"])
    log.info("crashes: %d", len(crashes))
    for k, name, why, text in crashes[:10]:
        log.info("  #%d (%s): %s", k, name, why)
    ts = sorted(times)
    log.info("time per script: median %.2f ms, p99 %.2f ms, max %.1f ms (%s)", statistics.median(ts) * 1000,
             ts[int(0.99 * len(ts))] * 1000, slowest[0] * 1000, slowest[1])
    if hostile_times:
        hs = sorted(hostile_times)
        log.info("hostile shapes: %d scripts, median %.1f ms, max %.1f ms", len(hs), statistics.median(hs) * 1000,
                 hs[-1] * 1000)
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
