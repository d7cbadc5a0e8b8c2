"""Values no launch script means, answered as the user's error and never as "internal parser error"
(issue 32): integers past Python's 4,300-digit conversion limit and lone surrogates (a JSON escape
of no character) in text that the shell writes to a file and a config reader then parses."""
from __future__ import annotations

import pytest

from slurm_plugin.launch import parse_script

BIG = "9" * 5000          # int(BIG) raises ValueError: Python refuses more than 4,300 digits
LAUNCH = ("srun python pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 2 "
          "--seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8 "
          "--train-iters 10\n")


def _answer(script: str):
    res = parse_script("job.sh", script)
    assert res.error is None or ("internal" not in res.error and res.error.startswith("cannot predict: ")), \
        res.error
    return res


@pytest.mark.parametrize("script", [
    f"#!/bin/bash\nset -- a b\nsrun python pretrain_gpt.py --num-layers ${{{BIG}}}\n",
    f"#!/bin/bash\nA=([{BIG}]=x)\n" + LAUNCH,
    f"#!/bin/bash\nA=([1]=x [{BIG}]=y z)\necho ${{A[@]}}\n" + LAUNCH,
    f"#!/bin/bash\nA=(x y)\nA+=(z)\nA[{BIG}]=w\nA+=(v)\necho ${{A[-1]}}\n" + LAUNCH,
    f"#!/bin/bash\nif [ {BIG} -gt 1 ]; then X=1; fi\n" + LAUNCH,
    f"#!/bin/bash\nshift {BIG}\n" + LAUNCH,
], ids=["positional", "array-key", "array-next-index", "array-append", "test", "shift"])
def test_huge_integers_are_user_errors_or_ignored(script):
    _answer(script)


def test_huge_positional_names_nothing():
    res = _answer(f"#!/bin/bash\nL=${{{BIG}}}\n" + LAUNCH.replace("--num-layers 2", "--num-layers 2$L"))
    assert res.job is not None and res.job.model.layers == 2


def test_lone_surrogate_in_a_heredoc_written_json_is_replaced_not_a_crash():
    script = ('#!/bin/bash\ncat > ds.json <<EOF\n{"train_batch_size": "\udcff", "zero_optimization": '
              '{"stage": 1}}\nEOF\nsrun deepspeed pretrain_gpt.py --deepspeed --deepspeed_config ds.json '
              + LAUNCH.split("pretrain_gpt.py ", 1)[1])
    res = _answer(script)
    # The value is what a file would hold for an undecodable byte (U+FFFD): named, never a crash.
    assert any("train_batch_size" in w and "\ufffd" in w for w in res.warnings), res.warnings


def test_lone_surrogate_in_the_script_and_its_environment():
    res = parse_script("job.sh", "#!/bin/bash\n# \udcff\nX=\"\udcff\"\n" + LAUNCH, env={"Y": "\ud800"})
    assert res.job is not None, res.error


@pytest.mark.parametrize("script", [
    f"#!/bin/bash\n#SBATCH --time={BIG}\n" + LAUNCH,
    f"#!/bin/bash\n#SBATCH --time=1-{BIG}\n" + LAUNCH,
    f"#!/bin/bash\n#SBATCH --nodes={BIG}\n" + LAUNCH,
    f"#!/bin/bash\n#SBATCH --gpus-per-node={BIG}\n" + LAUNCH,
    f"#!/bin/bash\ncat > t.toml <<EOF\n[training]\nsteps = {BIG}\nEOF\n"
    "torchrun --nproc_per_node 8 -m torchtitan.train --job.config_file t.toml\n",
], ids=["time", "time-days", "nodes", "gpus-per-node", "torchtitan-steps"])
def test_huge_integers_in_sbatch_lines_and_configs_are_user_errors(script):
    _answer(script)
