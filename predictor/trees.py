"""Tree ensembles as flat arrays, evaluated for many models at once with numpy.

Calling XGBoost or LightGBM costs about a millisecond per call whatever the batch, and a prediction
needs some forty models; loading their JSON takes seconds.  So at fit time each model is also
written as a *tree table* (``.npz`` of plain arrays, read with ``allow_pickle=False``), and
:class:`Forest` walks every tree of every model in one vectorised loop over depth.

Comparisons follow each library exactly: XGBoost sends ``x < threshold`` left in float32;
LightGBM sends ``x <= threshold`` left in float64, stored here as ``x < nextafter(threshold)``.
Leaves point to themselves, so a fixed number of steps (the deepest tree) reaches every leaf.
"""
from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

_FIELDS = ("feature", "threshold", "left", "right", "value", "roots")


@dataclass
class TreeTable:
    feature: np.ndarray      # int32 per node (0 on leaves)
    threshold: np.ndarray    # float64 per node (+inf on leaves)
    left: np.ndarray         # int32 per node, tree-local + table offset (self on leaves)
    right: np.ndarray
    value: np.ndarray        # float64 leaf value (0 on internal nodes)
    roots: np.ndarray        # int32 node index of each tree's root
    base: float              # added to the sum of leaves
    depth: int               # steps from a root to its deepest leaf
    float32: bool            # compare features in float32 (XGBoost)
    n_features: int

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.savez_compressed(buf, **{f: getattr(self, f) for f in _FIELDS},
                            meta=np.array([self.base, self.depth, float(self.float32), self.n_features]))
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> "TreeTable":
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {f: z[f] for f in _FIELDS}
            meta = z["meta"]
        n = len(arrays["feature"])
        for f in ("threshold", "left", "right", "value"):
            if len(arrays[f]) != n:
                raise ValueError(f"tree table arrays differ in length ({f})")
        if n and (arrays["left"].min() < 0 or arrays["left"].max() >= n or arrays["right"].min() < 0
                  or arrays["right"].max() >= n or arrays["roots"].max() >= n):
            raise ValueError("tree table points outside itself")
        return cls(arrays["feature"].astype(np.int32), arrays["threshold"].astype(float),
                   arrays["left"].astype(np.int32), arrays["right"].astype(np.int32),
                   arrays["value"].astype(float), arrays["roots"].astype(np.int32),
                   float(meta[0]), int(meta[1]), bool(meta[2]), int(meta[3]))


class _Builder:
    def __init__(self) -> None:
        self.feature: list[int] = []
        self.threshold: list[float] = []
        self.left: list[int] = []
        self.right: list[int] = []
        self.value: list[float] = []
        self.roots: list[int] = []
        self.depth = 0

    def tree(self, internal: Sequence[tuple[int, float, int, int]], leaves: Sequence[float],
             leaf_ref) -> None:
        """internal: (feature, threshold, left, right) with children as ("n", i) / ("l", j) refs."""
        off = len(self.feature)
        n_int = len(internal)
        resolve = lambda ref: off + (ref[1] if ref[0] == "n" else n_int + ref[1])
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
        ref = lambda n: ("n", ipos[n]) if n in ipos else ("l", lpos[n])
        # The root (node 0) must come first among internal nodes: ids are in breadth order.
        internal = [(int(feat[i]), float(np.float32(cond[i])), ref(lc[i]), ref(rc[i])) for i in internal_ids]
        leaves = [cond[i] for i in leaf_ids]       # a leaf's weight lives in split_conditions
        b.tree(internal, leaves, ref)
    return b.table(base, True, n_features)


def from_lightgbm_text(text: str, n_features: int) -> TreeTable:
    """A LightGBM text model (numerical splits only, as our features are)."""
    b = _Builder()
    for block in re.split(r"\nTree=\d+\n", "\n" + text.split("end of trees")[0])[1:]:
        kv = dict(line.split("=", 1) for line in block.strip().splitlines() if "=" in line)
        leaves = [float(v) for v in kv["leaf_value"].split()]
        if int(kv["num_leaves"]) == 1:
            b.tree([], leaves, None)
            continue
        feats = [int(v) for v in kv["split_feature"].split()]
        thr = [float(v) for v in kv["threshold"].split()]
        dts = [int(v) for v in kv["decision_type"].split()]
        lc = [int(v) for v in kv["left_child"].split()]
        rc = [int(v) for v in kv["right_child"].split()]
        if any(dt & 1 for dt in dts):
            raise ValueError("categorical splits are not supported")
        ref = lambda c: ("n", c) if c >= 0 else ("l", ~c)
        internal = [(feats[i], float(np.nextafter(thr[i], np.inf)), ref(lc[i]), ref(rc[i]))
                    for i in range(len(feats))]
        b.tree(internal, leaves, ref)
    return b.table(0.0, False, n_features)


class Forest:
    """Many tree tables stacked so that one loop evaluates all of them."""

    def __init__(self, tables: Sequence[TreeTable]):
        offs = np.cumsum([0] + [len(t.feature) for t in tables])
        cat = lambda f, dt: np.concatenate([getattr(t, f) for t in tables]).astype(dt) if tables else np.zeros(0, dt)
        self.feature = cat("feature", np.int64)
        self.threshold = cat("threshold", float)
        shift = np.concatenate([np.full(len(t.feature), o) for t, o in zip(tables, offs)]) if tables else np.zeros(0)
        self.left = (cat("left", np.int64) + shift).astype(np.int64)
        self.right = (cat("right", np.int64) + shift).astype(np.int64)
        self.value = cat("value", float)
        # child[2·node + (x < threshold)]: one gather picks the branch (right at 0, left at 1).
        self.child = np.stack([self.right, self.left], axis=1).ravel()
        self.roots = [t.roots.astype(np.int64) + o for t, o in zip(tables, offs)]
        self.tables = list(tables)
        self.width = max([t.n_features for t in tables], default=1)

    def predict(self, requests: Sequence[tuple[int, np.ndarray]]) -> list[np.ndarray]:
        """Raw model outputs for each (model index, rows × features) request."""
        if not requests:
            return []
        blocks, pair_nodes, pair_rows, pair_out, sizes = [], [], [], [], []
        row0 = out0 = 0
        depth = 0
        for mi, X in requests:
            t = self.tables[mi]
            X = np.asarray(X, dtype=float).reshape(len(X), -1)
            if t.float32:
                X = X.astype(np.float32).astype(float)
            pad = np.zeros((len(X), self.width))
            pad[:, : X.shape[1]] = X
            blocks.append(pad)
            roots = self.roots[mi]
            n = len(X)
            pair_nodes.append(np.tile(roots, n))
            pair_rows.append(np.repeat(np.arange(row0, row0 + n), len(roots)))
            pair_out.append(np.repeat(np.arange(out0, out0 + n), len(roots)))
            sizes.append(n)
            row0 += n
            out0 += n
            depth = max(depth, t.depth)
        Xall = np.vstack(blocks).ravel()
        node = np.concatenate(pair_nodes)
        rowbase = np.concatenate(pair_rows) * self.width
        out = np.concatenate(pair_out)
        feature, threshold, child = self.feature, self.threshold, self.child
        for _ in range(depth):
            go_left = Xall[rowbase + feature[node]] < threshold[node]
            node = child[2 * node + go_left]
        sums = np.bincount(out, weights=self.value[node], minlength=out0)
        res, start = [], 0
        for (mi, _), n in zip(requests, sizes):
            res.append(sums[start:start + n] + self.tables[mi].base)
            start += n
        return res
