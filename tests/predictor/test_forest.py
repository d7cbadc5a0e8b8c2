"""The forest: the trees every prediction walks, its file format, and bundles written in it.

Exactness is checked against the libraries themselves (rows exactly on split thresholds, where
``<`` against ``<=`` and float32 against float64 decide the branch), and format-1 bundles against
their conversion, bit for bit.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from calibrate.fitting import BundleFitter, RatioRegressor, convert_bundle
from predictor import BundleError
from predictor.bundle import FOREST_FILE, MANIFEST, load_bundle
from predictor.operators import GpuSpec
from predictor.samples import SampleSet, SampleTable, dump_toml, operator_columns
from predictor import trees
from predictor.trees import LEAF_FEATURE, Forest, ForestError, TreeTable

GPU = GpuSpec("Test GPU", 16, {"fp16": 100.0, "bf16": 100.0, "fp32": 10.0}, 1000.0)
LIBRARIES = ("random_forest", "xgboost", "lightgbm")


C_WALK = trees._c_walk()


@pytest.fixture(autouse=True, params=["c", "numpy"])
def walker(request, monkeypatch):
    """Every test here runs with both forest walks: the C one (predictor/_walk.c) and numpy's."""
    if request.param == "c":
        if C_WALK is None:
            if os.environ.get("CI") == "true" and shutil.which("cc"):
                pytest.fail("predictor._walk is not built although a C compiler is here")
            pytest.skip("predictor._walk is not built here (no C compiler at install)")
        monkeypatch.setattr(trees, "_FOREST_SUMS", C_WALK)
    else:
        monkeypatch.setattr(trees, "_FOREST_SUMS", None)
    return request.param


def _data(seed: int, n: int = 240, width: int = 3):
    rng = np.random.default_rng(seed)
    # Grid values (as log2 shapes are): many rows share split values.
    X = rng.integers(6, 16, size=(n, width)).astype(float) + rng.choice([0.0, 0.5], size=(n, width))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] - 0.05 * X[:, -1] ** 1.5 + rng.normal(0, 0.05, n)
    return X, y


@pytest.fixture(scope="module")
def fitted():
    """One fitted regressor per library (3 features), fitted once for the module."""
    X, y = _data(0)
    return {lib: RatioRegressor((lib,)).fit(X, y) for lib in LIBRARIES}


def _threshold_rows(table: TreeTable, float32: bool, lightgbm: bool, n: int = 300) -> np.ndarray:
    """Rows whose values sit exactly on the model's split thresholds (and just beside them)."""
    rng = np.random.default_rng(5)
    internal = table.left != np.arange(len(table.left))
    rows = np.empty((n, table.n_features))
    for f in range(table.n_features):
        t = table.threshold[internal & (table.feature == f)]
        if lightgbm:
            t = np.nextafter(t, -np.inf)          # the library's own threshold (x <= t goes left)
        if not len(t):
            t = np.array([10.0])
        pick = rng.choice(t, n)
        nudge = rng.choice([0, 0, 1, -1], n)
        rows[:, f] = np.where(nudge == 0, pick, np.nextafter(pick, np.where(nudge > 0, np.inf, -np.inf)))
    if float32:
        # Values a float32 cast moves across a float32 threshold: the library compares in float32.
        rows[::4] = rows[::4] + 1e-9
    return rows


@pytest.mark.parametrize("library", LIBRARIES)
def test_rows_on_split_thresholds_take_the_libraries_branches(fitted, library):
    est = fitted[library]
    Q = _threshold_rows(est.table_, est.table_.float32, library == "lightgbm")
    ours = est.predict_log(Q)
    theirs = est.library_predict(Q)
    # A branch taken the other way moves a prediction by a leaf (> 1e-4 here); float32
    # accumulation in the library by ~1e-7.
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-5)


def test_forest_file_round_trip_and_many_models_at_once(fitted):
    tables = [fitted[lib].table_ for lib in LIBRARIES]
    forest = Forest.from_tables(tables, list(LIBRARIES))
    again = Forest.from_buffer(forest.to_bytes())
    assert again.keys == list(LIBRARIES)
    assert np.array_equal(again.records.view(np.int64), forest.records.view(np.int64))
    rng = np.random.default_rng(3)
    reqs = [(i % 3, rng.uniform(5, 17, size=(k, 3))) for i, k in enumerate([1, 4, 0, 7, 2, 3])]
    together = again.predict(reqs)
    alone = [Forest.from_tables([tables[i]]).predict([(0, X)])[0] for i, X in reqs]
    # Same bits whether evaluated alone or with others, in any order, deep models or not.
    for a, b in zip(together, alone):
        assert a.shape == b.shape and np.array_equal(a, b)
    backwards = again.predict(reqs[::-1])[::-1]
    assert all(np.array_equal(a, b) for a, b in zip(together, backwards))
    assert together[2].shape == (0,)
    assert again.predict([]) == []


def test_rows_of_many_models_in_one_call_match_one_request_each(fitted):
    """predict_rows (what a prediction uses): rows of mixed models in any order, columns past a
    model's features ignored, the same bits as one request per model."""
    tables = [fitted[lib].table_ for lib in LIBRARIES]
    forest = Forest.from_tables(tables, list(LIBRARIES))
    rng = np.random.default_rng(7)
    models = rng.integers(0, 3, size=40)
    X = rng.uniform(5, 17, size=(40, 6))          # columns 3-5: padding the models never read
    got = forest.predict_rows(models, X)
    for i, m in enumerate(models):
        (alone,) = forest.predict([(int(m), X[i:i + 1, :3])])
        assert got[i] == alone[0]
    X[:, 3:] = rng.uniform(-1e9, 1e9, size=(40, 3))
    assert np.array_equal(forest.predict_rows(models, X), got)
    assert forest.predict_rows([], np.zeros((0, 3))).shape == (0,)
    with pytest.raises(ValueError, match="at most 7 features"):
        forest.predict_rows(models, np.zeros((40, 8)))


def test_forest_matches_a_plain_walk_of_the_tables(fitted):
    """The re-laid-out forest against the simplest evaluator of the original tables, bit for bit."""
    rng = np.random.default_rng(11)
    for lib in LIBRARIES:
        t = fitted[lib].table_
        X = rng.uniform(4, 18, size=(25, 3))
        X[0] = [np.inf, -np.inf, np.nan]
        Xc = X.astype(np.float32).astype(float) if t.float32 else X
        want = np.zeros(len(X))
        for i, x in enumerate(Xc):
            acc = 0.0
            for r in t.roots:
                n = r
                while t.left[n] != n:
                    n = t.left[n] if x[t.feature[n]] < t.threshold[n] else t.right[n]
                acc += t.value[n]
            want[i] = acc + t.base
        got = Forest.from_tables([t]).predict([(0, X)])[0]
        assert np.array_equal(got, want), lib


def test_wrong_width_is_refused(fitted):
    forest = Forest.from_tables([fitted["lightgbm"].table_], ["m"])
    with pytest.raises(ValueError, match="model m: rows of 2 features, the model has 3"):
        forest.predict([(0, np.zeros((1, 2)))])


def _malformed_tables():
    leaf = dict(feature=np.array([0], np.int32), threshold=np.array([np.inf]), left=np.array([0], np.int32),
                right=np.array([0], np.int32), value=np.array([1.0]), roots=np.array([0], np.int32))
    shared = dict(feature=np.array([0, 0, 0], np.int32), threshold=np.array([1.0, 2.0, np.inf]),
                  left=np.array([1, 2, 2], np.int32), right=np.array([2, 2, 2], np.int32),
                  value=np.zeros(3), roots=np.array([0], np.int32))
    cycle = dict(feature=np.array([0, 0], np.int32), threshold=np.array([1.0, 2.0]),
                 left=np.array([1, 0], np.int32), right=np.array([1, 0], np.int32),
                 value=np.zeros(2), roots=np.array([0], np.int32))
    wide = dict(leaf, feature=np.array([0, 5, 0], np.int32), threshold=np.array([np.inf, 1.0, np.inf]),
                left=np.array([0, 0, 2], np.int32), right=np.array([0, 2, 2], np.int32),
                value=np.zeros(3), roots=np.array([1], np.int32))
    return [(leaf, 9, "features"), (shared, 1, "reached twice"), (cycle, 1, "reached twice|cycle"),
            (wide, 3, "feature the model does not have")]


@pytest.mark.parametrize("arrays,n_features,message", _malformed_tables())
def test_tables_that_are_not_trees_are_refused(arrays, n_features, message):
    t = TreeTable(**arrays, base=0.0, depth=1, float32=False, n_features=n_features)
    with pytest.raises(ForestError, match=message):
        Forest.from_tables([t], ["bad"])


# ----------------------------------------------------------------------------------- bundles
def _samples(n: int = 200) -> SampleSet:
    rng = np.random.default_rng(0)
    m = rng.choice([512, 1024, 2048, 4096, 8192], n).astype(float)
    k = rng.choice([1024, 2048, 4096], n).astype(float)
    nn = rng.choice([768, 1536, 3072, 6144], n).astype(float)
    fwd = 2 * m * k * nn / (100e12 * np.clip(0.3 + 0.05 * np.log2(m), 0.1, 0.9)) * 1e6
    table = np.column_stack([m, k, nn, fwd, 2.1 * fwd])
    return SampleSet(meta={"gpu": "Test GPU"},
                     operators={("linear1", "fp16"): SampleTable("linear1", "fp16", operator_columns("linear1"), table)})


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("forest") / "bundle"
    BundleFitter(name="t", gpu=GPU, candidates=("lightgbm", "xgboost")).fit(_samples(), out)
    return out


def _rewrite(bundle: Path, rel: str, data: bytes) -> None:
    """Replace a file and re-sign it in the manifest: only the content checks can object."""
    (bundle / rel).write_bytes(data)
    raw = tomllib.loads((bundle / MANIFEST).read_text())
    raw["sha256"][rel] = hashlib.sha256(data).hexdigest()
    (bundle / MANIFEST).write_text(dump_toml(raw))


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "b"
    shutil.copytree(src, dst)
    return dst


def test_fitted_bundle_is_one_forest_file(bundle_dir):
    raw = tomllib.loads((bundle_dir / MANIFEST).read_text())
    assert raw["format"] == 2 and raw["forest"] == FOREST_FILE
    assert all("table" not in e for e in raw["models"].values())
    b = load_bundle(bundle_dir)
    assert sorted(b.forest.keys) == sorted(raw["models"]) == ["linear1.bwd.fp16", "linear1.fwd.fp16"]


def test_forest_tampering_is_refused_by_checksum(bundle_dir, tmp_path):
    b = _copy(bundle_dir, tmp_path)
    data = bytearray((b / FOREST_FILE).read_bytes())
    data[-100] ^= 1
    (b / FOREST_FILE).write_bytes(bytes(data))
    with pytest.raises(BundleError, match=f"{FOREST_FILE}: checksum mismatch"):
        load_bundle(b)


def _header(data: bytes) -> tuple[dict, int]:
    n = int.from_bytes(data[8:12], "little")
    return json.loads(data[12:12 + n]), n


def _with_header(data: bytes, header: "dict | list") -> bytes:
    old, n = _header(data)
    start = -(-(12 + n) // 64) * 64
    blob = json.dumps(header).encode()
    new_start = -(-(12 + len(blob)) // 64) * 64
    out = bytearray(new_start)
    out[:12 + len(blob)] = b"PCFOREST" + len(blob).to_bytes(4, "little") + blob
    return bytes(out) + data[start:]


def _corruptions(data: bytes):
    header, _ = _header(data)
    n_nodes = header["nodes"]
    start = len(data) - 16 * n_nodes - 4 * header["trees"]
    outside = bytearray(data)
    word = ((n_nodes + 5) << 3) | 1
    outside[start + 8:start + 16] = word.to_bytes(8, "little", signed=True)
    negative = bytearray(data)
    negative[start + 8:start + 16] = (-8).to_bytes(8, "little", signed=True)
    renamed = dict(header, models=[dict(m, key="other.fwd.fp16") if i == 0 else m
                                   for i, m in enumerate(header["models"])])
    gapped = dict(header, models=[dict(m, first_node=m["first_node"] + 1) if i == 1 else m
                                  for i, m in enumerate(header["models"])])
    return [
        (b"NOTAFOREST" + data[10:], "bad magic"),
        (data[:-4], "header says"),
        (data[:12] + b"}" + data[13:], "bad forest header"),
        (_with_header(data, [1, 2]), "bad forest header"),
        (bytes(outside), "points outside the forest"),
        (bytes(negative), "points outside the forest"),
        (_with_header(data, dict(header, format=7)), "forest format 7"),
        (_with_header(data, gapped), "not where the previous model ends"),
        (_with_header(data, renamed), "models missing from the forest: linear1"),
    ]


def test_malformed_forests_are_refused_naming_the_file(bundle_dir, tmp_path):
    data = (bundle_dir / FOREST_FILE).read_bytes()
    for i, (bad, message) in enumerate(_corruptions(data)):
        b = _copy(bundle_dir, tmp_path / str(i))
        _rewrite(b, FOREST_FILE, bad)
        with pytest.raises(BundleError, match=f"{FOREST_FILE}.*{message}"):
            load_bundle(b)


def test_paths_leading_out_of_the_bundle_are_refused(bundle_dir, tmp_path):
    b = _copy(bundle_dir, tmp_path)
    (tmp_path / "outside.bin").write_bytes(b"x")
    raw = tomllib.loads((b / MANIFEST).read_text())
    for rel in ("../outside.bin", "/etc/passwd", "models/../../outside.bin"):
        bad = dict(raw, sha256={**raw["sha256"], rel: "0" * 64})
        (b / MANIFEST).write_text(dump_toml(bad))
        with pytest.raises(BundleError, match="points outside the bundle"):
            load_bundle(b)
    (b / "models" / "link.gz").symlink_to(tmp_path / "outside.bin")
    (b / MANIFEST).write_text(dump_toml(dict(raw, sha256={**raw["sha256"], "models/link.gz": "0" * 64})))
    with pytest.raises(BundleError, match="points outside the bundle"):
        load_bundle(b)


def _write_format1(fitted_by_key: dict, d: Path) -> None:
    """A bundle as perfcast wrote it before the forest file: one .npz tree table per model."""
    (d / "models").mkdir(parents=True)
    models, sums = {}, {}
    for key, est in fitted_by_key.items():
        t = est.table_
        ext = ".txt.gz" if est.library_ == "lightgbm" else ".json.gz"
        buf = io.BytesIO()
        np.savez_compressed(buf, feature=t.feature, threshold=t.threshold, left=t.left, right=t.right,
                            value=t.value, roots=t.roots,
                            meta=np.array([t.base, t.depth, float(t.float32), t.n_features]))
        files = {f"models/{key}{ext}": est.model_bytes_, f"models/{key}.trees.npz": buf.getvalue()}
        for rel, data in files.items():
            (d / rel).write_bytes(data)
            sums[rel] = hashlib.sha256(data).hexdigest()
        models[key] = {"file": f"models/{key}{ext}", "table": f"models/{key}.trees.npz",
                       "library": est.library_, "samples": est.n_samples_,
                       "validation_mape": est.validation_mape_, "validation_p90": est.validation_p90_,
                       "feature_min": [1.0] * 3, "feature_max": [2.0] * 3,
                       "candidate_mape": est.candidate_mape_}
    (d / "LICENSE").write_text("MIT\n")
    sums["LICENSE"] = hashlib.sha256(b"MIT\n").hexdigest()
    manifest = {"format": 1, "kind": "compute", "name": "old", "gpu": GPU.name,
                "created": "2026-01-01T00:00:00+00:00",
                "gpu_spec": {"name": GPU.name, "memory_gib": GPU.memory_gib, "memory_gbps": GPU.memory_gbps,
                             "tflops": dict(GPU.tflops)},
                "models": models, "sha256": sums}
    (d / MANIFEST).write_text(dump_toml(manifest))


def test_format1_bundles_load_and_convert_without_changing_a_bit(fitted, tmp_path):
    keys = {"linear1.fwd.fp16": fitted["xgboost"], "linear1.bwd.fp16": fitted["lightgbm"],
            "linear2.fwd.fp16": fitted["random_forest"]}
    old = tmp_path / "old"
    _write_format1(keys, old)
    rng = np.random.default_rng(2)
    reqs = [(k, rng.uniform(5, 17, size=(9, 3))) for k in keys]
    b1 = load_bundle(old)
    assert b1.format == 1
    before = b1.ratios(reqs)
    for (k, X), r in zip(reqs, before):
        assert np.array_equal(r, keys[k].predict(X))
    new = convert_bundle(old, tmp_path / "new")
    b2 = load_bundle(new)
    assert b2.format == 2 and b2.manifest["converted_from_format"] == 1
    assert b2.manifest["created"] == "2026-01-01T00:00:00+00:00"
    assert all(np.array_equal(a, b) for a, b in zip(before, b2.ratios(reqs)))
    assert not list(new.rglob("*.npz")) and (new / "LICENSE").read_text() == "MIT\n"
    for k, est in keys.items():      # the library files travel unchanged
        assert gzip.decompress((new / b2.models[k].info.file).read_bytes()) == gzip.decompress(est.model_bytes_)
    assert convert_bundle(new) == new                   # already current: nothing to do
    # In place: the same directory, now format 2, the same predictions.
    assert convert_bundle(old) == old and load_bundle(old).format == 2
    assert all(np.array_equal(a, b) for a, b in zip(before, load_bundle(old).ratios(reqs)))


def test_a_corrupt_format1_table_names_its_file(fitted, tmp_path):
    d = tmp_path / "old"
    _write_format1({"linear1.fwd.fp16": fitted["lightgbm"]}, d)
    _rewrite(d, "models/linear1.fwd.fp16.trees.npz", b"not an npz")
    with pytest.raises(BundleError, match="linear1.fwd.fp16.trees.npz: not a valid tree table"):
        load_bundle(d)


def test_the_predictor_never_imports_the_regressor_libraries():
    code = ("import sys, predictor\n"
            "from predictor import TrainingJob, load_platform, predict\n"
            "for name in ('perlmutter-a100', 'dgx-h100'):\n"
            "    predict(TrainingJob.from_toml('examples/gpt20b-perlmutter.toml'), load_platform(name))\n"
            "heavy = {'xgboost', 'lightgbm', 'sklearn', 'scipy', 'torch', 'pandas'}\n"
            "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))\n")
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_leaf_feature_is_the_infinite_column():
    # The walk relies on it: a leaf compares +inf < value, false, and stays where it is.
    assert LEAF_FEATURE == 7 and Forest.from_tables([]).predict([]) == []


def test_shipped_bundles_are_in_the_current_format():
    from predictor.bundle import BUNDLE_FORMAT
    from predictor.platform import SHIPPED_DIR
    manifests = sorted(SHIPPED_DIR.glob(f"*/*/{MANIFEST}"))
    assert len(manifests) >= 5
    for m in manifests:
        raw = tomllib.loads(m.read_text())
        assert raw["format"] == BUNDLE_FORMAT and (m.parent / raw["forest"]).is_file(), m
        assert not list(m.parent.rglob("*.npz")), m


@pytest.mark.parametrize("walker", ["c"], indirect=True)
def test_the_c_walk_refuses_what_it_cannot_walk_safely(fitted, walker):
    """The C walk checks sizes and every node it follows (a second wall behind Forest._validate):
    a bad call is a ValueError, never a read outside the buffers."""
    forest = Forest.from_tables([fitted["xgboost"].table_], ["m"])
    one = np.ones(1, np.int64)
    args = [forest.records, forest.roots, np.zeros(1, np.int64), np.array([forest._trees[0]], np.int64),
            np.array([forest._depth[0]], np.int64), np.zeros((1, 8)), np.empty(1)]
    C_WALK(*args)
    assert np.isfinite(args[-1][0])
    with pytest.raises(ValueError, match="sizes"):
        C_WALK(*args[:5], np.zeros((1, 7)), np.empty(1))
    with pytest.raises(ValueError, match="outside"):
        C_WALK(args[0], args[1], one * len(forest.roots), *args[3:])     # trees past the roots
    bad = forest.records.copy()
    bad.view(np.int64)[1] = (len(bad) + 5) << 3                         # a root pointing away
    with pytest.raises(ValueError, match="outside"):
        C_WALK(bad, *args[1:])
    with pytest.raises(TypeError):
        C_WALK(*args[:6], np.empty(1)[::1].tobytes())                    # out must be writable
