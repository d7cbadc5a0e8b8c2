"""Where the lent H100's stack measurements are kept, and which of their files hold training steps.

``benchmarks/bench_gpu_stacks.py`` writes one JSON file per call into the stacks folder; the files
named here hold its stacks part's rows (each job's step under a software stack), which
calibrate/stack_runs.py turns into runs.  The folder also holds ``attention.json`` and
``compile.json``, which are not steps of the family.  Torch-free.
"""
from __future__ import annotations

from pathlib import Path

#: The folder in a source checkout (benchmarks/data/h100-lent/stacks/README.md says what each file is).
LENT_STACKS_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h100-lent" / "stacks"

#: The files of training-step rows, in the order they were recorded.
STEP_FILES = ("stacks.json", "stacks2.json", "stacks3.json", "stacks4.json", "stacks5.json", "stacks6.json",
              "hseries.json", "longseq.json", "longseq-flash.json", "stacks7.json")
#: Training-step rows of a later lease's machine, kept out of the family's runs: its host ran the
#: same steps ~1.17x slower (``rngseries-runs.toml`` holds them as a site's runs of their own).
OTHER_HOST_STEP_FILES = ("rngseries.json", "rngseries2.json")
#: Held-out steps (``--jobs heldout``, a later lease): no figure, fit or modelling choice may read
#: them; ``bench_gpu_stacks.py --compare --files`` checks the model against them.
HELDOUT_STEP_FILES = ("heldout-stacks.json", "heldout-stacks2.json")


def step_files(folder: Path = LENT_STACKS_DIR) -> list[Path]:
    """The :data:`STEP_FILES` that ``folder`` holds, in order."""
    return [folder / name for name in STEP_FILES if (folder / name).exists()]
