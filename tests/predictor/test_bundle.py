import shutil
from pathlib import Path

import numpy as np
import pytest

from calibrate.fitting import BundleFitter, RatioRegressor
from calibrate.store import append_rows, write_meta
from predictor import BundleError, load_platform
from predictor.bundle import load_bundle
from predictor.operators import GpuSpec
from predictor.platform import SHIPPED_DIR
from predictor.samples import SampleSet, SampleTable, load_samples, operator_columns

GPU = GpuSpec("Test GPU", 16, {"fp16": 100.0, "bf16": 100.0, "fp32": 10.0}, 1000.0)


def synthetic_samples(rng, n=300):
    """linear1 with an efficiency that rises with size (a known curve the fit must recover)."""
    m = rng.choice([512, 1024, 2048, 4096, 8192], n).astype(float)
    k = rng.choice([1024, 2048, 3072, 4096], n).astype(float)
    nn = rng.choice([768, 1536, 3072, 6144], n).astype(float)
    flops = 2 * m * k * nn
    eff = 0.3 + 0.5 * (np.log2(m * k * nn) - 29) / 10
    fwd = flops / (100e12 * np.clip(eff, 0.1, 0.9)) * 1e6
    table = np.column_stack([m, k, nn, fwd, 2 * fwd])
    return SampleSet(meta={"gpu": "Test GPU"},
                     operators={("linear1", "fp16"): SampleTable("linear1", "fp16", operator_columns("linear1"), table)})


@pytest.fixture(scope="module")
def small_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("b") / "bundle"
    rep = BundleFitter(name="test", gpu=GPU).fit(synthetic_samples(np.random.default_rng(0)), out)
    return out, rep


def test_fit_chooses_by_validation_and_is_accurate(small_bundle):
    out, rep = small_bundle
    info = rep.models["linear1.fwd.fp16"]
    assert info.library in ("random_forest", "xgboost", "lightgbm")
    assert info.validation_mape == min(info.candidate_mape.values())
    assert info.validation_mape < 0.03
    assert (out / "manifest.toml").is_file() and (out / "forest.bin").is_file()
    assert not list(out.rglob("*.pkl")) and not list(out.rglob("*.npz"))


def test_load_verifies_and_predicts(small_bundle):
    out, _ = small_bundle
    b = load_bundle(out)
    X = np.log2(np.array([[2048.0, 2048.0, 3072.0], [8192.0, 4096.0, 6144.0]]))
    fwd, bwd = b.ratios([("linear1.fwd.fp16", X), ("linear1.bwd.fp16", X)])
    assert np.all((0.1 < fwd) & (fwd < 10))
    # The synthetic efficiency rises with size: the larger GEMM is nearer its roofline.
    assert fwd[1] < fwd[0]


@pytest.mark.parametrize("library", ["random_forest", "xgboost", "lightgbm"])
def test_tree_tables_match_the_libraries(library):
    """The numpy evaluator must give the libraries' own predictions, for every library."""
    rng = np.random.default_rng(1)
    X = rng.uniform(8, 14, size=(400, 3))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] - 0.1 * X[:, 2] ** 1.5 + rng.normal(0, 0.05, 400)
    est = RatioRegressor(candidates=(library,)).fit(X, y)
    assert est.library_ == library
    Q = rng.uniform(7, 15, size=(200, 3))      # beyond the range too
    ours = np.log(est.predict(Q))
    theirs = est.library_predict(Q)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


def test_tampered_model_refused(small_bundle, tmp_path):
    out, _ = small_bundle
    b = _copy(out, tmp_path)
    model = next((b / "models").iterdir())
    data = bytearray(model.read_bytes())
    data[-5] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=f"{model.name}.*checksum mismatch"):
        load_bundle(b)


def test_truncated_and_missing_refused(small_bundle, tmp_path):
    out, _ = small_bundle
    b = _copy(out, tmp_path)
    model = next((b / "models").iterdir())
    model.write_bytes(model.read_bytes()[:100])
    with pytest.raises(BundleError, match="checksum mismatch"):
        load_bundle(b)
    model.unlink()
    with pytest.raises(BundleError, match="missing"):
        load_bundle(b)


def test_bad_manifest_refused(small_bundle, tmp_path):
    out, _ = small_bundle
    b = _copy(out, tmp_path)
    (b / "manifest.toml").write_text("format = 99\n")
    with pytest.raises(BundleError, match="format 99"):
        load_bundle(b)
    (b / "manifest.toml").write_text("format = [\n")
    with pytest.raises(BundleError, match="manifest.toml"):
        load_bundle(b)


def test_shipped_platform_tamper_refused(tmp_path, monkeypatch):
    root = tmp_path / "plats"
    shutil.copytree(SHIPPED_DIR / "_bundles" / "gh200-120gb", root / "_bundles" / "gh200-120gb")
    shutil.copytree(SHIPPED_DIR / "vista-gh200", root / "vista-gh200")
    victim = root / "_bundles" / "gh200-120gb" / "models" / "linear1.fwd.fp16.json.gz"
    if not victim.exists():
        victim = next((root / "_bundles" / "gh200-120gb" / "models").glob("linear1.fwd.fp16.*"))
    victim.write_bytes(b"\x1f\x8b" + victim.read_bytes()[2:-3])
    with pytest.raises(BundleError, match="linear1.fwd.fp16"):
        load_platform(root / "vista-gh200")


def test_shipped_bundles_carry_the_licence():
    for b in ("a100-sxm4-80gb", "gh200-120gb"):
        d = SHIPPED_DIR / "_bundles" / b
        assert "MIT" in (d / "LICENSE").read_text()
        assert "arXiv:2509.22832" in (d / "manifest.toml").read_text()


def test_sample_store_round_trip_and_errors(tmp_path):
    d = tmp_path / "s"
    write_meta(d, {"gpu": "x"})
    cols = operator_columns("gelu")
    append_rows(d / "operators" / "gelu_fp16.csv", cols, [[4096, 8192, 10.0, 20.0]])
    append_rows(d / "operators" / "gelu_fp16.csv", cols, [[8192, 8192, 19.0, 41.0]])
    s = load_samples(d)
    assert len(s.operators[("gelu", "fp16")]) == 2
    (d / "operators" / "gelu_fp16.csv").write_text("tokens,width,fwd_us,bwd_us\n1,2,x,4\n")
    with pytest.raises(BundleError, match="gelu_fp16.csv:2"):
        load_samples(d)
    (d / "operators" / "nonsense_fp16.csv").write_text("a\n")
    (d / "operators" / "gelu_fp16.csv").unlink()
    with pytest.raises(BundleError, match="unknown sample file"):
        load_samples(d)


# --- the manifest pinned by the platform --------------------------------------------------------

def _vista_copy(tmp_path: Path) -> Path:
    root = tmp_path / "plats"
    shutil.copytree(SHIPPED_DIR / "_bundles" / "gh200-120gb", root / "_bundles" / "gh200-120gb")
    shutil.copytree(SHIPPED_DIR / "vista-gh200", root / "vista-gh200")
    return root


def _edit_manifest(bundle: Path) -> None:
    """An edit that keeps every model file valid: only the pin can catch it."""
    m = bundle / "manifest.toml"
    m.write_text(m.read_text().replace('kind = "compute"', 'kind = "compute"\n# edited'))


def test_shipped_platforms_pin_their_manifests():
    import tomllib
    from predictor.bundle import manifest_sha256
    for d in sorted(p for p in SHIPPED_DIR.iterdir() if (p / "platform.toml").is_file()):
        raw = tomllib.loads((d / "platform.toml").read_text())
        assert raw["compute_bundle_sha256"] == manifest_sha256(d / raw["compute_bundle"]), d.name
        if raw.get("collective_bundle"):
            assert raw["collective_bundle_sha256"] == manifest_sha256(d / raw["collective_bundle"])


def test_edited_manifest_refused_when_pinned(tmp_path):
    root = _vista_copy(tmp_path)
    load_platform(root / "vista-gh200", reload=True)
    _edit_manifest(root / "_bundles" / "gh200-120gb")
    with pytest.raises(BundleError, match="manifest.toml: manifest checksum mismatch.*compute_bundle_sha256"):
        load_platform(root / "vista-gh200", reload=True)


def test_edited_manifest_refused_even_when_the_bundle_was_cached(tmp_path):
    root = _vista_copy(tmp_path)
    load_platform(root / "vista-gh200")                 # bundle cached by (path, mtime)
    plat = root / "vista-gh200" / "platform.toml"
    lines = [(f'compute_bundle_sha256 = "{"f" * 64}"\n' if l.startswith("compute_bundle_sha256")
              else l) for l in plat.read_text().splitlines(keepends=True)]
    plat.write_text("".join(lines))                      # the pin changes, the manifest does not
    with pytest.raises(BundleError, match="manifest checksum mismatch"):
        load_platform(root / "vista-gh200")


def test_unpinned_platform_loads_as_before(tmp_path):
    root = _vista_copy(tmp_path)
    plat = root / "vista-gh200" / "platform.toml"
    plat.write_text("".join(l for l in plat.read_text().splitlines(keepends=True)
                            if "_sha256" not in l))
    _edit_manifest(root / "_bundles" / "gh200-120gb")
    assert load_platform(root / "vista-gh200", reload=True).name == "vista-gh200"


def test_bad_pin_value_is_one_clear_error(tmp_path):
    root = _vista_copy(tmp_path)
    plat = root / "vista-gh200" / "platform.toml"
    lines = [('compute_bundle_sha256 = "abc"\n' if l.startswith("compute_bundle_sha256") else l)
             for l in plat.read_text().splitlines(keepends=True)]
    plat.write_text("".join(lines))
    with pytest.raises(BundleError, match="platform.toml: compute_bundle_sha256 must be a sha256"):
        load_platform(root / "vista-gh200", reload=True)


def test_pin_platform_bundles_keeps_every_other_key(tmp_path):
    """dgx-h100 has [host] tables and [[validation]] entries: all of it must survive as it is."""
    import tomllib
    from predictor.platform import pin_platform_bundles
    root = tmp_path / "plats"
    shutil.copytree(SHIPPED_DIR / "_bundles" / "h100-80gb-hbm3", root / "_bundles" / "h100-80gb-hbm3")
    shutil.copytree(SHIPPED_DIR / "dgx-h100", root / "dgx-h100")
    f = root / "dgx-h100" / "platform.toml"
    pinned = f.read_text()
    unpinned = "".join(l for l in pinned.splitlines(keepends=True) if "_sha256" not in l)
    f.write_text(unpinned)
    before = tomllib.loads(unpinned)
    assert "host" in before and before.get("validation")
    pins = pin_platform_bundles(root / "dgx-h100")
    assert set(pins) == {"compute_bundle_sha256"}
    after = tomllib.loads(f.read_text())
    assert {k: v for k, v in after.items() if k not in pins} == before
    assert f.read_text() == pinned                       # the shipped file is exactly this
    assert pin_platform_bundles(root / "dgx-h100") == {}  # idempotent
    load_platform(root / "dgx-h100", reload=True)


def test_write_platform_pins_the_bundles_it_names(small_bundle, tmp_path):
    import tomllib
    from predictor.bundle import manifest_sha256
    from predictor.platform import write_platform
    out, _ = small_bundle
    d = tmp_path / "p"
    shutil.copytree(out, d / "compute")
    write_platform(d, {"name": "p", "gpus_per_node": 1, "compute_bundle": "compute",
                       "compute_bundle_sha256": "0" * 64,     # stale: recomputed
                       "links": {"intra_gbps": 1.0, "intra_latency_us": 1.0, "nic_gbps": 1.0,
                                 "nics_per_node": 1, "inter_latency_us": 1.0}})
    raw = tomllib.loads((d / "platform.toml").read_text())
    assert raw["compute_bundle_sha256"] == manifest_sha256(d / "compute")
    assert list(raw)[:4] == ["name", "gpus_per_node", "compute_bundle", "compute_bundle_sha256"]
    load_platform(d, reload=True)
