"""The regressor libraries: their estimators, their model files, and those files as tree tables.

Models are stored in the libraries' own portable formats, gzip-compressed: XGBoost JSON (for both
gradient boosting and its random-forest mode, which stands in for scikit-learn's forest because a
scikit-learn forest can only be saved with pickle) and LightGBM text.  The predictor reads neither:
each fitted model is also converted here into a :class:`predictor.trees.TreeTable`, and the
bundle's forest file is built from those.  XGBoost and LightGBM are imported only when a function
here needs them (fitting, or checking a model against its library).
"""
from __future__ import annotations

import gzip
import json
import re
from typing import Any, Callable, Sequence

import numpy as np

from predictor.trees import TreeTable

CANDIDATES = ("random_forest", "xgboost", "lightgbm")

# Below this many rows a second thread costs more than it saves, and with XGBoost and LightGBM
# both loaded their OpenMP pools can spin against each other on a busy machine (fits that took
# 0.03 s stalled for minutes in calibration tests).
THREADED_MIN_ROWS = 2000


def check_candidates(candidates: Sequence[str]) -> tuple[str, ...]:
    """``candidates`` as a tuple, refused when empty, repeated or naming an unknown library."""
    if isinstance(candidates, str):
        raise ValueError(f"candidates must be a sequence of library names, not the string {candidates!r}")
    libs = tuple(candidates)
    if not libs:
        raise ValueError("candidates: at least one regressor library is needed")
    unknown = [c for c in libs if c not in CANDIDATES]
    if unknown:
        raise ValueError(f"candidates: unknown regressor library {unknown[0]!r} "
                         f"(known: {', '.join(CANDIDATES)})")
    if len(set(libs)) != len(libs):
        raise ValueError(f"candidates: a library is named twice in {libs}")
    return libs


def make_estimator(library: str, n_samples: int, seed: int) -> Any:
    """An unfitted estimator of ``library`` with perfcast's settings."""
    # Imported here: the daemon loads models without ever constructing estimators.
    import lightgbm as lgb
    import xgboost as xgb

    n_jobs = 2 if n_samples >= THREADED_MIN_ROWS else 1
    if library == "random_forest":
        return xgb.XGBRFRegressor(n_estimators=100, max_depth=10, subsample=0.8, colsample_bynode=1.0,
                                  learning_rate=1.0, min_child_weight=1, n_jobs=n_jobs, random_state=seed)
    if library == "xgboost":
        return xgb.XGBRegressor(n_estimators=300, max_depth=6, learning_rate=0.08, subsample=0.9,
                                min_child_weight=1, n_jobs=n_jobs, random_state=seed)
    if library == "lightgbm":
        # Depth is bounded so the vectorised evaluator needs few steps (predictor.trees).
        return lgb.LGBMRegressor(n_estimators=300, learning_rate=0.06, num_leaves=31, max_depth=10,
                                 min_child_samples=max(2, min(5, n_samples // 20)), subsample=0.9,
                                 subsample_freq=1, verbose=-1, n_jobs=n_jobs, random_state=seed)
    raise ValueError(f"unknown regressor library {library!r}")


def serialise(library: str, est: Any, n_features: int) -> tuple[bytes, TreeTable]:
    """(gzip-compressed library model file, the same trees as a table) of a fitted estimator."""
    if library == "lightgbm":
        raw = est.booster_.model_to_string().encode()
        table = from_lightgbm_text(raw.decode(), n_features)
    else:
        raw = bytes(est.get_booster().save_raw(raw_format="json"))
        table = from_xgboost_json(raw, n_features)
    return gzip.compress(raw, compresslevel=9, mtime=0), table


def library_predict(library: str, model_bytes: bytes, X: np.ndarray) -> np.ndarray:
    """The library's own prediction from a stored model file (used to check the tree tables)."""
    raw = gzip.decompress(model_bytes)
    if library == "lightgbm":
        import lightgbm as lgb
        return np.asarray(lgb.Booster(model_str=raw.decode()).predict(X), dtype=float)
    if library not in CANDIDATES:
        raise ValueError(f"unknown regressor library {library!r}")
    import xgboost as xgb
    booster = xgb.Booster()
    booster.load_model(bytearray(raw))
    return np.asarray(booster.inplace_predict(np.asarray(X, dtype=np.float32)), dtype=float)


# ------------------------------------------------------------------ library files -> tree tables
Ref = tuple[str, int]      # ("n", internal node) or ("l", leaf), positions within one tree


class _Builder:
    def __init__(self) -> None:
        self.feature: list[int] = []
        self.threshold: list[float] = []
        self.left: list[int] = []
        self.right: list[int] = []
        self.value: list[float] = []
        self.roots: list[int] = []
        self.depth = 0

    def tree(self, internal: Sequence[tuple[int, float, Ref, Ref]], leaves: Sequence[float]) -> None:
        """internal: (feature, threshold, left, right) with children as ("n", i) / ("l", j) refs;
        the root is internal node 0 (or the only leaf)."""
        off = len(self.feature)
        n_int = len(internal)
        resolve: Callable[[Ref], int] = lambda ref: off + (ref[1] if ref[0] == "n" else n_int + ref[1])
        for feat, thr, lref, rref in internal:
            self.feature.append(feat)
            self.threshold.append(thr)
            self.left.append(resolve(lref))
            self.right.append(resolve(rref))
            self.value.append(0.0)
        for j, v in enumerate(leaves):
            me = off + n_int + j
            self.feature.append(0)
            self.threshold.append(np.inf)
            self.left.append(me)
            self.right.append(me)
            self.value.append(float(v))
        root = off if n_int else off + n_int   # a single-leaf tree's root is its leaf
        self.roots.append(root)
        self.depth = max(self.depth, _depth(self.left, self.right, root))

    def table(self, base: float, float32: bool, n_features: int) -> TreeTable:
        return TreeTable(np.array(self.feature, np.int32), np.array(self.threshold, float),
                         np.array(self.left, np.int32), np.array(self.right, np.int32),
                         np.array(self.value, float), np.array(self.roots, np.int32),
                         base, self.depth, float32, n_features)


def _depth(left: list[int], right: list[int], root: int) -> int:
    best, stack = 0, [(root, 0)]
    while stack:
        node, d = stack.pop()
        if left[node] == node:
            best = max(best, d)
            continue
        stack.append((left[node], d + 1))
        stack.append((right[node], d + 1))
    return best


def from_xgboost_json(raw: bytes, n_features: int) -> TreeTable:
    """An XGBoost JSON model (gradient boosting or random-forest mode, squared error)."""
    doc = json.loads(raw)
    learner = doc["learner"]
    base_txt = str(learner["learner_model_param"]["base_score"]).strip("[]")
    base = float(base_txt.split(",")[0])
    b = _Builder()
    for t in learner["gradient_booster"]["model"]["trees"]:
        lc, rc = t["left_children"], t["right_children"]
        cond, feat = t["split_conditions"], t["split_indices"]
        internal_ids = [i for i in range(len(lc)) if lc[i] != -1]
        leaf_ids = [i for i in range(len(lc)) if lc[i] == -1]
        ipos = {n: k for k, n in enumerate(internal_ids)}
        lpos = {n: k for k, n in enumerate(leaf_ids)}

        def ref(n: int) -> Ref:
            return ("n", ipos[n]) if n in ipos else ("l", lpos[n])
        # The root (node 0) must come first among internal nodes: ids are in breadth order.
        internal = [(int(feat[i]), float(np.float32(cond[i])), ref(lc[i]), ref(rc[i])) for i in internal_ids]
        leaves = [cond[i] for i in leaf_ids]       # a leaf's weight lives in split_conditions
        b.tree(internal, leaves)
    return b.table(base, True, n_features)


def from_lightgbm_text(text: str, n_features: int) -> TreeTable:
    """A LightGBM text model (numerical splits only, as our features are)."""
    b = _Builder()
    for block in re.split(r"\nTree=\d+\n", "\n" + text.split("end of trees")[0])[1:]:
        kv = dict(line.split("=", 1) for line in block.strip().splitlines() if "=" in line)
        leaves = [float(v) for v in kv["leaf_value"].split()]
        if int(kv["num_leaves"]) == 1:
            b.tree([], leaves)
            continue
        feats = [int(v) for v in kv["split_feature"].split()]
        thr = [float(v) for v in kv["threshold"].split()]
        dts = [int(v) for v in kv["decision_type"].split()]
        lc = [int(v) for v in kv["left_child"].split()]
        rc = [int(v) for v in kv["right_child"].split()]
        if any(dt & 1 for dt in dts):
            raise ValueError("categorical splits are not supported")

        def ref(c: int) -> Ref:
            return ("n", c) if c >= 0 else ("l", ~c)
        internal = [(feats[i], float(np.nextafter(thr[i], np.inf)), ref(lc[i]), ref(rc[i]))
                    for i in range(len(feats))]
        b.tree(internal, leaves)
    return b.table(0.0, False, n_features)
