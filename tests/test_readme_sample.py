"""README.md's perf-predict sample is what perf-predict prints (scripts/readme_sample.py)."""
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("readme_sample", REPO / "scripts" / "readme_sample.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_sample_is_current():
    mod = _script()
    assert mod.readme_sample() == mod.sample(), \
        "README.md's sample has drifted: python3 scripts/readme_sample.py --write"
