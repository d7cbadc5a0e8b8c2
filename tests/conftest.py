"""Settings for the whole suite, applied before any test module loads XGBoost or LightGBM."""
import os

# Two OpenMP runtimes (XGBoost's and LightGBM's) spinning on a 2-core CI machine can stall fits
# for minutes; passive waiting keeps them from starving each other.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_configure(config):
    """The suite never sees this machine's installed platforms: on a host where an admin ran
    ``perf-calibrate install`` (or a refit), /var/lib/perfcast/platforms/dgx-h100 would stand in
    for the shipped dgx-h100 and change what the tests compare.  Lookups and installs by default
    go to an empty root of the test session's own instead (tests that need a root pass their own)."""
    import tempfile
    from pathlib import Path

    import calibrate.install
    import predictor.platform
    root = Path(tempfile.mkdtemp(prefix="perfcast-site-root-")) / "platforms"
    predictor.platform.SITE_ROOT = root
    calibrate.install.DEFAULT_ROOT = root


def pytest_collection_modifyitems(session, config, items):
    """tests/daemon first: its daemons fork their workers from this very process, and a fork after
    other tests have run DeepSpeed's engine, gloo groups and torch's thread pools in-process can
    crash the child inside fork() (seen as thousands of segfaulting workers on a 2-core CI run).
    The real perf-predictd never loads any of them; only the test process does."""
    daemon_dir = os.path.join("tests", "daemon") + os.sep
    items.sort(key=lambda item: 0 if daemon_dir in str(item.fspath) else 1)
