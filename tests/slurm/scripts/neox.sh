#!/bin/bash
#SBATCH -N 2
#SBATCH --gres=gpu:4
#SBATCH --ntasks-per-node=1
# FAKE iters=5000 iter_s=0.8 config=@CONFIG@
# GPT-NeoX: the model lives in a YAML config that only the submitting user may read.
python ./deepy.py train.py @CONFIG@
