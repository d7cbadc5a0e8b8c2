"""platform.toml's keys: a misspelt key or table, or a bad value, is a one-line error naming the file
and the key (with the nearest known key), never ignored and never a Python message."""
import glob
import sys
from pathlib import Path

import pytest

from predictor import load_platform
from predictor.errors import BundleError
from predictor.platform import (GPU_KEYS, LINK_KEYS, OVERHEAD_KEYS, OVERLAY_KEYS, PLATFORM_KEYS, SHIPPED_DIR,
                                shipped_platform_sha256, write_platform)

from .conftest import copy_shipped_platform

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _shipped_raw(name: str = "dgx-h100") -> dict:
    return tomllib.loads((SHIPPED_DIR / name / "platform.toml").read_text(encoding="utf-8"))


# TOML's nan and inf, which the writer refuses: written as these numbers, then replaced in the text
NAN, INF = 987654.25, 987654.75


def _refused(tmp_path, match: str, **changes) -> str:
    d = copy_shipped_platform(tmp_path, "dgx-h100", **changes)
    f = d / "platform.toml"
    f.write_text(f.read_text(encoding="utf-8").replace(str(NAN), "nan").replace(str(INF), "inf"), encoding="utf-8")
    with pytest.raises(BundleError) as info:
        load_platform(d, reload=True)
    msg = str(info.value)
    assert str(d / "platform.toml") in msg and "\n" not in msg
    for internal in ("__init__", "keyword argument", "Traceback", "KeyError", "TypeError"):
        assert internal not in msg
    assert match in msg, msg
    return msg


def test_every_shipped_platform_uses_only_known_keys():
    for f in sorted(glob.glob(str(SHIPPED_DIR / "*" / "platform.toml"))):
        raw = tomllib.loads(Path(f).read_text(encoding="utf-8"))
        assert set(raw) <= PLATFORM_KEYS, f
        assert set(raw.get("links", {})) <= {*LINK_KEYS, "source"}, f
        assert set(raw.get("overheads", {})) <= set(OVERHEAD_KEYS), f
        assert set(raw.get("gpu", {})) <= set(GPU_KEYS), f
        load_platform(Path(f).parent, reload=True)


def test_a_platform_with_every_optional_table_loads(tmp_path):
    raw = _shipped_raw()
    d = copy_shipped_platform(
        tmp_path, "dgx-h100", description="d", calibrated=False,
        gpu={"name": "Other GPU", "memory_gib": 96.0, "memory_gbps": 4000.0, "tflops": {"fp16": 1000.0, "bf16": 1000}},
        overheads={"startup_seconds": 30.0, "step_seconds": 0, "checkpoint_gbps_per_node": 4.0,
                   "checkpoint_fixed_seconds": 5},
        fabric={"between_nodes_slowdown": 1.25, "source": "perf-calibrate fabric"},
        fitted={"compute_scale": 1.1, "runs": ["a"]}, links=dict(raw["links"]))
    plat = load_platform(d, reload=True)
    assert plat.overheads.startup_seconds == 30.0 and plat.gpu.name == "Other GPU"
    assert plat.fabric is not None and plat.fitted is not None and not plat.calibrated


def test_a_misspelt_overheads_table_is_refused_not_defaulted(tmp_path):
    msg = _refused(tmp_path, "[overhead]: unknown table (did you mean 'overheads'?)",
                   overhead={"startup_seconds": 5.0})
    # no default start-up (120 s) said in its place; the path is left out (pytest's folder may be
    # pytest-120)
    assert "120" not in msg.replace(str(tmp_path), "")


@pytest.mark.parametrize("changes, match", [
    ({"fabrc": {"between_nodes_slowdown": 1.5}}, "[fabrc]: unknown table (did you mean 'fabric'?)"),
    ({"descripton": "x"}, "descripton: unknown key (did you mean 'description'?)"),
    ({"valdation": [{"name": "x"}]}, "[[valdation]]: unknown array of tables (did you mean 'validation'?)"),
    ({"zzz": 1}, "zzz: unknown key"),
])
def test_unknown_top_level_keys_and_tables_are_refused(tmp_path, changes, match):
    _refused(tmp_path, match, **changes)


def test_an_unknown_key_in_a_complete_links_table_is_refused(tmp_path):
    links = {**_shipped_raw()["links"], "nic_gbs": 40}
    _refused(tmp_path, "links.nic_gbs: unknown key (did you mean 'nic_gbps'?)", links=links)


def test_a_typo_in_overheads_names_the_key_without_python(tmp_path):
    _refused(tmp_path, "overheads.startup_secs: unknown key (did you mean 'startup_seconds'?)",
             overheads={"startup_secs": 5.0})


def test_a_typo_in_gpu_is_refused(tmp_path):
    _refused(tmp_path, "gpu.memory_gbs: unknown key (did you mean 'memory_gbps'?)",
             gpu={"name": "G", "memory_gib": 80.0, "memory_gbs": 3000.0, "tflops": {"fp16": 900.0}})


@pytest.mark.parametrize("changes, match", [
    ({"overheads": {"startup_seconds": -5.0}}, "overheads.startup_seconds must be a finite number >= 0, got -5.0"),
    ({"overheads": {"step_seconds": NAN}}, "overheads.step_seconds must be a finite number >= 0"),
    ({"overheads": {"checkpoint_gbps_per_node": 0.0}}, "overheads.checkpoint_gbps_per_node must be a finite number > 0"),
    ({"overheads": {"checkpoint_fixed_seconds": "10"}}, "overheads.checkpoint_fixed_seconds must be a finite number"),
    ({"overheads": {"startup_seconds": True}}, "overheads.startup_seconds must be a finite number"),
    ({"calibrated": "yes"}, "calibrated must be true or false, got 'yes'"),
    ({"gpus_per_node": "8"}, "gpus_per_node must be a whole number >= 1"),
    ({"gpus_per_node": 0}, "gpus_per_node must be a whole number >= 1"),
    ({"gpus_per_node": None}, "gpus_per_node: missing"),
    ({"description": ["x"]}, "description must be a string"),
    ({"notes": "x"}, "notes must be a list of strings"),
    ({"overheads": 5}, "overheads must be a table"),
    ({"gpu": {"name": "G", "memory_gib": 80.0, "memory_gbps": 3000.0, "tflops": {"fp16": -1.0}}},
     "gpu.tflops.fp16 must be a finite number > 0"),
    ({"gpu": {"name": "G", "memory_gib": 80.0, "tflops": {"fp16": 9.0}}}, "gpu.memory_gbps: missing"),
])
def test_bad_values_are_refused_naming_the_key(tmp_path, changes, match):
    _refused(tmp_path, match, **changes)


@pytest.mark.parametrize("value, match", [(None, "name: missing"), (3, "name must be a non-empty string")])
def test_a_missing_or_bad_name_is_refused(tmp_path, value, match):
    d = copy_shipped_platform(tmp_path, "dgx-h100")
    f = d / "platform.toml"
    text = f.read_text(encoding="utf-8").replace('name = "dgx-h100"\n', "" if value is None else f"name = {value}\n", 1)
    f.write_text(text, encoding="utf-8")
    with pytest.raises(BundleError, match=match):
        load_platform(d, reload=True)


@pytest.mark.parametrize("key, value, match", [
    ("nic_gbps", -1.0, "links.nic_gbps must be a finite number > 0"),
    ("intra_gbps", INF, "links.intra_gbps must be a finite number > 0"),
    ("intra_latency_us", -0.5, "links.intra_latency_us must be a finite number >= 0"),
    ("nics_per_node", 8.5, "links.nics_per_node must be a whole number >= 1"),
    ("source", 1, "links.source must be a string"),
    ("inter_latency_us", None, "links.inter_latency_us: missing"),
])
def test_bad_links_are_refused_naming_the_key(tmp_path, key, value, match):
    links = dict(_shipped_raw()["links"])
    if value is None:
        del links[key]
    else:
        links[key] = value
    _refused(tmp_path, match, links=links)


def test_a_typo_in_a_site_overlay_gets_the_nearest_key(tmp_path):
    d = tmp_path / "ov"
    write_platform(d, {"name": "dgx-h100", "overlay_of": "dgx-h100",
                       "overlay_of_sha256": shipped_platform_sha256("dgx-h100"), "nots": ["x"]})
    with pytest.raises(BundleError, match=r"nots: not allowed in a site overlay .*did you mean 'notes'"):
        load_platform(d, reload=True)
    assert "description" in OVERLAY_KEYS


def test_perf_predict_exits_with_one_line(tmp_path, capsys):
    from slurm_plugin.cli_predict import main
    d = copy_shipped_platform(tmp_path, "dgx-h100", overhead={"startup_seconds": 5.0})
    job = Path(__file__).resolve().parents[2] / "examples" / "llama7b-dgx-h100.toml"
    assert main([str(job), "--platform", str(d)]) not in (0, None)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "[overhead]: unknown table" in err
