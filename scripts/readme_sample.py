"""The README's sample of perf-predict's output, produced by running it (never typed by hand).

    python3 scripts/readme_sample.py            # print the sample
    python3 scripts/readme_sample.py --write    # put it into README.md ("## What you get")
    python3 scripts/readme_sample.py --check    # exit 1 when README.md's sample has drifted

tests/test_readme_sample.py runs the check, so a change to the predictor that moves these numbers
fails until the README is regenerated with --write.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMAND = ["examples/gpt20b-perlmutter.toml", "--platform", "perlmutter-a100"]
# The lines of the output the README shows (the rest is elided with "...")
SHOWN = ("iteration ", "                          (90 % interval", "", "total ")
_BLOCK = re.compile(r"(## What you get\n\n```\n)(.*?)(```\n)", re.S)


def sample() -> str:
    """perf-predict's answer for the README's command, cut to the lines the README shows."""
    from slurm_plugin.cli_predict import main
    out = io.StringIO()
    here = os.getcwd()
    os.chdir(REPO)             # the README's command is run from the repository's root
    try:
        with contextlib.redirect_stdout(out):
            code = main(list(COMMAND))
    finally:
        os.chdir(here)
    if code != 0:
        raise SystemExit(f"perf-predict {' '.join(COMMAND)} exited with {code}")
    lines = out.getvalue().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("iteration "))
    kept = []
    for ln in lines[start:]:
        if any(ln.startswith(p) if p else ln == "" for p in SHOWN):
            kept.append(ln)
        if ln.startswith("total "):
            break
    return "$ perf-predict " + " ".join(COMMAND) + "\n...\n" + "\n".join(kept) + "\n"


def readme_sample(readme: Path = REPO / "README.md") -> str:
    m = _BLOCK.search(readme.read_text(encoding="utf-8"))
    if m is None:
        raise SystemExit(f"{readme}: no '## What you get' code block")
    return m.group(2)


def main(argv: "list[str] | None" = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="replace README.md's sample")
    g.add_argument("--check", action="store_true", help="exit 1 if README.md's sample differs")
    args = p.parse_args(argv)
    text = sample()
    readme = REPO / "README.md"
    if args.write:
        body = readme.read_text(encoding="utf-8")
        readme.write_text(_BLOCK.sub(lambda m: m.group(1) + text + m.group(3), body, count=1), encoding="utf-8")
        return 0
    if args.check:
        if readme_sample(readme) != text:
            print("README.md's sample differs from perf-predict's output; run "
                  "python3 scripts/readme_sample.py --write", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
