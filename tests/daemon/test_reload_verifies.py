"""A reload reads the platforms' files again: a bundle corrupted on disk since the daemon started
fails in the next engine a SIGHUP builds (platform_errors; the server then refuses that reload and
keeps the running one: tests/daemon/test_reload_config.py), not at the next restart while the
reload says it loaded."""
from __future__ import annotations

import shutil

from predictor.platform import SHIPPED_DIR
from slurm_plugin.daemon import Engine
from slurm_plugin.siteconfig import parse_site_config


def test_a_bundle_corrupted_after_the_start_fails_the_next_engine(tmp_path, monkeypatch):
    root = tmp_path / "plats"
    shutil.copytree(SHIPPED_DIR / "_bundles" / "gh200-120gb", root / "_bundles" / "gh200-120gb")
    shutil.copytree(SHIPPED_DIR / "vista-gh200", root / "vista-gh200")
    monkeypatch.setenv("PERFCAST_PLATFORMS", str(root))
    cfg = parse_site_config({"defaults": {"platform": "vista-gh200"}})
    first = Engine(cfg).load(lookup_partitions=False)
    assert "vista-gh200" in first.platforms and not first.platform_errors
    victim = next((root / "_bundles" / "gh200-120gb" / "models").glob("linear1.fwd.fp16.*"))
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF                     # one byte; the manifest and its mtime unchanged
    victim.write_bytes(bytes(raw))
    second = Engine(cfg).load(lookup_partitions=False)
    assert "vista-gh200" not in second.platforms
    assert "linear1.fwd.fp16" in second.platform_errors["vista-gh200"]
    assert "vista-gh200" in first.platforms        # what the old engine holds stays usable
