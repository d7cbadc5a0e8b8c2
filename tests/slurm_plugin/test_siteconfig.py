from __future__ import annotations

import pytest

from slurm_plugin.siteconfig import (SiteConfigError, config_path, load_site_config,
                                     parse_site_config)


def test_partitions_inherit_defaults(tmp_path):
    p = tmp_path / "perfcast.toml"
    p.write_text('[daemon]\nsocket = "/tmp/x.sock"\nsocket_mode = "0600"\n'
                 '[defaults]\nmargin = 0.3\n[partitions.gpu]\nplatform = "dgx-a100"\n'
                 '[partitions.big]\nplatform = "dgx-h100"\nmargin = 0.1\npolicy = "enforce"\n')
    cfg = load_site_config(str(p))
    assert cfg.daemon.socket_mode == 0o600
    assert cfg.partitions["gpu"].margin == 0.3 and cfg.partitions["gpu"].name == "gpu"
    assert cfg.partitions["big"].policy == "enforce" and cfg.partitions["big"].margin == 0.1
    assert cfg.platforms() == ["dgx-a100", "dgx-h100"]
    assert cfg.partition("cpu") is None            # unmanaged: left alone


def test_defaults_with_platform_manage_every_partition():
    cfg = parse_site_config({"defaults": {"platform": "dgx-a100"}})
    assert cfg.partition("anything").platform == "dgx-a100"


@pytest.mark.parametrize("data, where", [
    ({"partitions": {"gpu": {}}}, "partitions.gpu.platform"),
    ({"partitions": {"gpu": {"platform": "x", "policy": "reject"}}}, "partitions.gpu.policy"),
    ({"defaults": {"margin": "lots"}}, "defaults.margin"),
    ({"defaults": {"fill_level": 0.9}}, "defaults.fill_level: must be between 0.95 and 0.999"),
    ({"partitions": {"gpu": {"platform": "x", "fill_level": 1.0}}}, "partitions.gpu.fill_level"),
    ({"daemon": {"socket": "relative.sock"}}, "daemon.socket"),
    ({"daemon": {"sokcet": "/x"}}, "daemon.sokcet"),
    ({"extra": {}}, "unknown section"),
    ({"daemon": {"workers": -1}}, "daemon.workers"),
    ({"daemon": {"workers": "4"}}, "daemon.workers"),
    ({"daemon": {"max_queue": 0}}, "daemon.max_queue"),
])
def test_errors_name_the_key(data, where):
    with pytest.raises(SiteConfigError, match=where.replace(".", r"\.")):
        parse_site_config(data)


def test_bad_toml_is_one_line(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[daemon\n")
    with pytest.raises(SiteConfigError, match="not valid TOML"):
        load_site_config(str(p))


def test_config_path_precedence():
    assert config_path("/a", {"PERFCAST_CONFIG": "/b"}) == "/a"
    assert config_path(None, {"PERFCAST_CONFIG": "/b"}) == "/b"
    assert config_path(None, {}) == "/etc/perfcast/perfcast.toml"


def test_shipped_example_is_valid():
    from slurm_plugin.siteconfig import example_path
    cfg = load_site_config(str(example_path()))
    assert cfg.partitions


def test_workers_default_to_one_per_core():
    from slurm_plugin.daemon import worker_count
    from slurm_plugin.daemon.engine import usable_cores
    cfg = parse_site_config({})
    assert cfg.daemon.workers == 0 and worker_count(cfg.daemon) == min(16, usable_cores())
    assert worker_count(parse_site_config({"daemon": {"workers": 3}}).daemon) == 3


@pytest.mark.parametrize("raw, needle", [
    (b"# caf\xe9 config\n[partitions.gpu]\nplatform = \"perlmutter-a100\"\n", "not UTF-8 text (byte 5)"),
    (b"\xef\xbb\xbf[partitions.gpu]\nplatform = \"perlmutter-a100\"\n", "byte-order mark"),
])
def test_a_config_that_is_not_plain_utf8_is_one_line_naming_it(tmp_path, raw, needle):
    """A Latin-1 comment used to raise UnicodeDecodeError through perf-predict --config."""
    p = tmp_path / "perfcast.toml"
    p.write_bytes(raw)
    with pytest.raises(SiteConfigError) as exc:
        load_site_config(str(p))
    assert needle in str(exc.value) and str(p) in str(exc.value)
