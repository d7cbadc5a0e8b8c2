"""`perf-calibrate validate --dry-run` says what the real run would do (QA finding 9).

An installed or shipped platform is never written in place: the real run installs a new
``<stamp>-validate`` version.  The dry run used to say "would record N runs in
.../current/platform.toml"; it now says that it would install that version (or nothing, when the
fit is declined), and writes, locks and creates nothing.  No torch: the shipped dgx-a100 under a
temporary platforms root, runs its own predictions x a known scale (as test_install_rollback_more).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from calibrate.install import validate_as_new_version
from calibrate.validate import validate_platform

from .test_install_rollback_more import _harvested, root  # noqa: F401  (fixture)
from .test_refit import _no_real_daemon  # noqa: F401  (autouse: no real perf-predictd reloaded)

STAMP = r"\d{8}T\d{6}Z-validate"


def _tree(d: Path) -> dict[str, bytes | None]:
    """Every path under ``d`` (links as their target), with file contents: what a dry run must not change."""
    if not d.exists():
        return {}
    return {str(p.relative_to(d)): (str(p.readlink()).encode() if p.is_symlink() else
                                    p.read_bytes() if p.is_file() else None)
            for p in sorted(d.rglob("*"))}


def test_dry_run_of_a_shipped_platform_says_it_would_install_a_validate_version(root):
    runs = _harvested(1.3)
    summary, inst = validate_as_new_version("dgx-a100", runs, root=root, fit=True, dry_run=True)
    assert inst is None
    assert re.search(rf"would install a new version \({STAMP}\) under {re.escape(str(root / 'dgx-a100'))} "
                     r"holding 6 runs and the fitted factors \(previous: the shipped platform dgx-a100, kept for "
                     r"rollback\) \(dry run: nothing written\)", summary.outcome), summary.outcome
    assert "would record" not in summary.outcome
    assert summary.to_dict()["outcome"] == summary.outcome
    assert not root.exists()                       # not even the partition's folder or its lock
    # The real run does what the dry run said.
    real, inst = validate_as_new_version("dgx-a100", runs, root=root, fit=True)
    assert inst is not None and re.fullmatch(STAMP, inst.version)
    assert real.outcome == inst.message and "installed" in real.outcome


def test_dry_run_of_an_installed_version_names_it_as_previous_and_writes_nothing(root):
    _, first = validate_as_new_version("dgx-a100", _harvested(1.3), root=root, fit=True)
    assert first is not None
    before = _tree(root)
    summary, inst = validate_as_new_version("dgx-a100", _harvested(1.5, first=2000), root=root, dry_run=True)
    assert inst is None
    assert re.search(rf"would install a new version \({STAMP}\) .* holding 12 runs \(previous: {first.version}, "
                     r"kept for rollback\)", summary.outcome), summary.outcome
    assert summary.platform_file == root / "dgx-a100" / "versions" / first.version / "platform.toml"
    assert _tree(root) == before


def test_dry_run_whose_fit_is_declined_would_install_nothing(root):
    runs = _harvested(1.0)                         # the platform's own predictions: nothing to learn
    summary, inst = validate_as_new_version("dgx-a100", runs, root=root, fit=True, dry_run=True)
    assert inst is None and summary.fit is not None and not summary.fit.improves
    assert "would install nothing" in summary.outcome and "would install a new version" not in summary.outcome
    assert not root.exists()
    real, inst = validate_as_new_version("dgx-a100", runs, root=root, fit=True)
    assert inst is None and real.outcome == "nothing installed (the fit was not written)"


def test_a_platform_folder_of_ones_own_is_recorded_in_place(tmp_path):
    from predictor.platform import SHIPPED_DIR
    from predictor.samples import dump_toml
    import sys
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    raw = tomllib.loads((SHIPPED_DIR / "dgx-a100" / "platform.toml").read_text())
    raw["compute_bundle"] = str(SHIPPED_DIR / "_bundles" / "a100-sxm4-80gb")
    d = tmp_path / "site"
    d.mkdir()
    (d / "platform.toml").write_text(dump_toml(raw))
    runs = _harvested(1.2, n=3)
    dry = validate_platform(d, runs, dry_run=True)
    assert dry.outcome == f"would record 3 runs in {d / 'platform.toml'} (dry run: nothing written)"
    assert validate_platform(d, runs).outcome == f"recorded 3 runs in {d / 'platform.toml'}"


@pytest.mark.parametrize("fit", [False, True])
def test_dry_run_of_a_name_neither_shipped_nor_installed_is_refused(root, fit):
    from calibrate.errors import CalibrationError
    with pytest.raises(CalibrationError, match="neither a platform shipped with perfcast nor installed"):
        validate_as_new_version("nosuch", _harvested(1.3), root=root, fit=fit, dry_run=True)
