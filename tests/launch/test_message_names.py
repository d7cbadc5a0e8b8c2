"""Messages name what the user wrote: a DeepSpeed config's own key, not the reader's fact name; a
launch that names no tokenizer says so rather than "tokenizer ?"."""
from __future__ import annotations

from .helpers import parse_in

SCRIPT = ("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --gpus-per-node=8\n"
          "deepspeed --num_gpus 8 pretrain_gpt.py --deepspeed --deepspeed_config ds.json "
          "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
          "--max-position-embeddings 1024 --micro-batch-size 2 --global-batch-size 16 --train-iters 10 --bf16\n")


def test_a_deepspeed_batch_size_below_one_is_named_by_its_key(tmp_path):
    res = parse_in(tmp_path, SCRIPT, {"ds.json": '{"train_batch_size": -512, "bf16": {"enabled": true}}'})
    assert res.job is None and "train_batch_size = -512 must be at least 1" in res.error, res.error
    assert "ds_train_batch" not in res.error


def test_no_tokenizer_named_is_said_so(tmp_path):
    res = parse_in(tmp_path, SCRIPT, {"ds.json": '{"train_batch_size": 16, "bf16": {"enabled": true}}'})
    assert res.job is not None, res.error
    (w,) = [w for w in res.warnings if "vocabulary size unknown" in w]
    assert "(no tokenizer named)" in w and "tokenizer ?" not in w
