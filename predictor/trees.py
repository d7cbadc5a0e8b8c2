"""Tree ensembles as flat arrays, evaluated for many models at once with numpy.

Calling XGBoost or LightGBM costs about a millisecond per call whatever the batch, and a prediction
needs some forty models; loading their JSON takes seconds.  So at fit time every model of a bundle
is also written into one *forest file* (:func:`Forest.to_bytes`), which :class:`Forest` reads
without copying and walks -- every tree of every model requested -- in one vectorised loop over
depth.  The predictor never imports the libraries.

Comparisons follow each library exactly: XGBoost sends ``x < threshold`` left in float32 (rows of
its models are rounded to float32 first; its thresholds are float32 values); LightGBM sends
``x <= threshold`` left in float64, stored here as ``x < nextafter(threshold)``.  Leaves sum in
float64, tree by tree in the library's order, then the model's base score is added: the sums are
the same bits whatever the layout below.

Layout (one record of 16 bytes per node, so that one gather fetches everything a step needs):

* word 0, float64: the split threshold of an internal node, the value of a leaf;
* word 1, int64:   ``next << 3 | feature``.  An internal node's children are adjacent: the right
  one at ``next``, the left one at ``next + 1``, so a step is ``node = next + (x < threshold)``.
  A leaf has ``next`` = itself and feature :data:`LEAF_FEATURE`, a column that holds +inf in every
  row: ``inf < value`` is false, so a leaf stays put and a fixed number of steps (the model's
  depth) brings every tree to its leaf.

The walk itself is in C where it was built (``predictor/_walk.c``: the same records, comparisons
and order of sums, so the same bits) and in numpy otherwise (:meth:`Forest._sums_numpy`).

Nodes are in breadth-first order per model (the top levels, which every row visits, share cache
lines).  Format-1 bundles kept one ``.npz`` :class:`TreeTable` per model; they are still read
(:meth:`Forest.from_tables`), just more slowly.
"""
from __future__ import annotations

import io
import json
import logging
import os
import struct
import sys
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

log = logging.getLogger(__name__)


def _c_walk():
    """The C walk (predictor/_walk.c), where it was built and may be used, else None.

    It reads records in native byte order, so only on little-endian machines (the file format's
    order).  PERFCAST_NUMPY_WALK=1 forces the numpy walk (tests compare the two)."""
    if sys.byteorder != "little" or os.environ.get("PERFCAST_NUMPY_WALK") == "1":
        return None
    try:
        from predictor import _walk
    except ImportError:
        log.debug("predictor._walk is not built (no C compiler at install): numpy forest walk")
        return None
    return _walk.forest_sums


_FOREST_SUMS = _c_walk()

FOREST_MAGIC = b"PCFOREST"
FOREST_FORMAT = 1
FEATURE_BITS = 3
LEAF_FEATURE = (1 << FEATURE_BITS) - 1       # the +inf column: features 0..6 are real ones
MAX_FEATURES = LEAF_FEATURE
COLUMNS = 1 << FEATURE_BITS                  # row width of the walk's feature matrix
_ALIGN = 64                                  # arrays start on a cache line
_HEAD = struct.Struct("<8sI")                # magic, JSON header length
MAX_HEADER_BYTES = 16 << 20

# numpy has no 16-byte record type that gathers as fast as a native one; complex128 is 16 bytes,
# and ``take`` copies its bits unchanged (no arithmetic ever touches it as a complex number).
_RECORD = np.dtype("<c16")
_WORD_LOW = np.dtype("<i4")                  # a record read as four int32s: word 1 is the third
MAX_NODES = 1 << (31 - FEATURE_BITS)         # so that every word (next << 3 | feature) is < 2**31


class ForestError(ValueError):
    """A forest file or tree table that is not one we wrote (the caller names the file)."""

    def __init__(self, message: str, key: str = ""):
        super().__init__(message)
        self.key = key          # the model at fault, where one is


@dataclass(frozen=True)
class ForestModel:
    """Where one model's trees are in a :class:`Forest`, and how to evaluate them."""

    key: str
    first_tree: int       # index into the forest's roots
    trees: int
    first_node: int       # its nodes are [first_node, first_node + nodes)
    nodes: int
    depth: int            # steps from a root to the deepest leaf
    base: float           # added to the sum of leaves
    float32: bool         # compare features in float32 (XGBoost)
    n_features: int


# ------------------------------------------------------------------------------ format-1 tables
_FIELDS = ("feature", "threshold", "left", "right", "value", "roots")


@dataclass
class TreeTable:
    """One model's trees as node arrays: how fitting hands over trees, and format-1 bundles' files."""

    feature: np.ndarray      # int32 per node (0 on leaves)
    threshold: np.ndarray    # float64 per node (+inf on leaves)
    left: np.ndarray         # int32 per node, table-local (self on leaves)
    right: np.ndarray
    value: np.ndarray        # float64 leaf value (0 on internal nodes)
    roots: np.ndarray        # int32 node index of each tree's root
    base: float              # added to the sum of leaves
    depth: int               # steps from a root to its deepest leaf
    float32: bool            # compare features in float32 (XGBoost)
    n_features: int

    @classmethod
    def from_bytes(cls, data: bytes) -> "TreeTable":
        """A format-1 ``.trees.npz`` (plain arrays, read with ``allow_pickle=False``)."""
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {f: z[f] for f in _FIELDS}
            meta = z["meta"]
        n = len(arrays["feature"])
        for f in ("threshold", "left", "right", "value"):
            if len(arrays[f]) != n:
                raise ForestError(f"tree table arrays differ in length ({f})")
        if n and (arrays["left"].min() < 0 or arrays["left"].max() >= n or arrays["right"].min() < 0
                  or arrays["right"].max() >= n or arrays["roots"].min() < 0 or arrays["roots"].max() >= n):
            raise ForestError("tree table points outside itself")
        if len(meta) != 4:
            raise ForestError("tree table metadata has the wrong size")
        return cls(arrays["feature"].astype(np.int32), arrays["threshold"].astype(float),
                   arrays["left"].astype(np.int32), arrays["right"].astype(np.int32),
                   arrays["value"].astype(float), arrays["roots"].astype(np.int32),
                   float(meta[0]), int(meta[1]), bool(meta[2]), int(meta[3]))


def _relayout(t: TreeTable) -> tuple[np.ndarray, np.ndarray, int]:
    """(records, roots, depth) of one table: breadth-first, children adjacent, leaves self-looped.

    Vectorised level by level over all the model's trees.  Refuses tables that are not trees
    (a node reached twice, a cycle), which would otherwise walk to a wrong leaf.
    """
    n = len(t.feature)
    if not (len(t.threshold) == len(t.left) == len(t.right) == len(t.value) == n):
        raise ForestError("tree table arrays differ in length")
    if t.n_features < 1 or t.n_features > MAX_FEATURES:
        raise ForestError(f"{t.n_features} features (at most {MAX_FEATURES} are supported)")
    left = t.left.astype(np.int64)
    right = t.right.astype(np.int64)
    idx = np.arange(n)
    leaf = left == idx
    if np.any(leaf & (right != idx)):
        raise ForestError("a leaf with one child")
    internal = ~leaf
    if np.any(internal & ((t.feature < 0) | (t.feature >= t.n_features))):
        raise ForestError("a split on a feature the model does not have")
    new_pos = np.full(n, -1, np.int64)
    frontier = t.roots.astype(np.int64)
    new_pos[frontier] = np.arange(len(frontier))
    if len(frontier) and np.any(new_pos[frontier] != np.arange(len(frontier))):
        raise ForestError("two trees share a root")
    levels = [frontier]
    nxt = len(frontier)
    depth = 0
    while True:
        inner = frontier[internal[frontier]]
        if not len(inner):
            break
        depth += 1
        if depth > n:
            raise ForestError("a tree with a cycle")
        kids = np.empty(2 * len(inner), np.int64)
        kids[0::2] = right[inner]            # right at next, left at next + 1
        kids[1::2] = left[inner]
        pos = nxt + np.arange(len(kids))
        if np.any(new_pos[kids] >= 0):
            raise ForestError("a node reached twice (not a tree)")
        new_pos[kids] = pos
        if np.any(new_pos[kids] != pos):
            raise ForestError("a node reached twice (not a tree)")
        nxt += len(kids)
        levels.append(kids)
        frontier = kids
    order = np.concatenate(levels) if levels else np.zeros(0, np.int64)
    pos = np.arange(len(order), dtype=np.int64)
    is_leaf = leaf[order]
    word0 = np.where(is_leaf, t.value[order], t.threshold[order]).astype(np.float64)
    child = new_pos[right[order]]
    word1 = np.where(is_leaf, (pos << FEATURE_BITS) | LEAF_FEATURE,
                     (child << FEATURE_BITS) | t.feature[order].astype(np.int64))
    rec = np.empty(len(order), _RECORD)
    pair = rec.view(np.float64).reshape(-1, 2)
    pair[:, 0] = word0
    rec.view(np.int64).reshape(-1, 2)[:, 1] = word1
    return rec, np.arange(len(t.roots), dtype=np.int64), depth


# ---------------------------------------------------------------------------------- the forest
@dataclass(frozen=True)
class RowModels:
    """What a walk reads of each row's model, for one list of models (:meth:`Forest.row_models`):
    a caller that asks the same list again keeps it (a Predictor: a daemon's jobs of one layout)."""

    mods: np.ndarray               # model index per row
    first_tree: np.ndarray         # int64 per row (the C walk's)
    trees: np.ndarray
    depth: np.ndarray
    base: np.ndarray
    float32: Optional[np.ndarray]  # rows × 1, compared in float32 (XGBoost's); None: no row is


class Forest:
    """Every model of a bundle stacked so that one loop over depth evaluates any set of them."""

    def __init__(self, records: np.ndarray, roots: np.ndarray, models: Sequence[ForestModel]):
        """``records``: complex128 node records (module docstring); ``roots``: global node index of
        every tree; ``models``: their slices.  Validated: indices out of range raise ForestError."""
        if records.dtype != _RECORD or records.ndim != 1:
            raise ForestError("node records must be a flat array of 16-byte records")
        self.records = records
        self.roots = np.ascontiguousarray(roots, dtype=np.int32)
        self.models = list(models)
        self._validate()
        self._keys = {m.key: i for i, m in enumerate(self.models)}
        self._trees = np.array([m.trees for m in self.models], dtype=np.intp)
        self._first_tree = np.array([m.first_tree for m in self.models], dtype=np.intp)
        self._base = np.array([m.base for m in self.models], dtype=np.float64)
        self._depth = np.array([m.depth for m in self.models], dtype=np.intp)
        self._float32 = np.array([m.float32 for m in self.models], dtype=bool)
        # The C walk reads int64 per row.
        self._first_tree64 = self._first_tree.astype(np.int64)
        self._trees64 = self._trees.astype(np.int64)
        self._depth64 = self._depth.astype(np.int64)

    @property
    def keys(self) -> list[str]:
        return [m.key for m in self.models]

    def index(self, key: str) -> int:
        return self._keys[key]

    def _validate(self) -> None:
        """Indices in range, so that a bad file fails here, naming itself, not in a prediction.

        Feature indices need no check: ``& LEAF_FEATURE`` keeps them inside a row, and a column a
        model does not have holds +inf.  Two passes over the records: a bundle loads in
        milliseconds.
        """
        n = len(self.records)
        if n > MAX_NODES:
            raise ForestError(f"{n} nodes; a forest holds at most {MAX_NODES}")
        words = self.records.view(np.int64)[1::2]
        if n:
            last = (n - 1) << FEATURE_BITS
            # As unsigned, a negative ``next`` is huge: one pass bounds both ends.
            if words.view(np.uint64).max() > last | LEAF_FEATURE:
                raise ForestError("a node points outside the forest")
            # An internal node's left child is at next + 1: only a leaf may have next = n - 1.
            at_end = words[words >= last]
            if np.any(at_end != last | LEAF_FEATURE):
                raise ForestError("a node points outside the forest")
        if len(self.roots) and (self.roots.min() < 0 or self.roots.max() >= n):
            raise ForestError("a tree root outside the forest")
        node0 = tree0 = 0
        seen_keys = set()
        for m in self.models:
            if m.key in seen_keys:
                raise ForestError(f"model {m.key} appears twice")
            seen_keys.add(m.key)
            # Models are stored one after the other, trees and nodes alike.
            if m.first_tree != tree0 or m.first_node != node0:
                raise ForestError(f"model {m.key}: trees or nodes not where the previous model ends")
            tree0, node0 = m.first_tree + m.trees, m.first_node + m.nodes
            if tree0 > len(self.roots) or node0 > n:
                raise ForestError(f"model {m.key}: trees or nodes outside the forest")
            r = self.roots[m.first_tree:tree0]
            if len(r) and (r.min() < m.first_node or r.max() >= node0):
                raise ForestError(f"model {m.key}: a root outside its nodes")
            if not 1 <= m.n_features <= MAX_FEATURES:
                raise ForestError(f"model {m.key}: {m.n_features} features (1 to {MAX_FEATURES})")
            if not 0 <= m.depth <= 64:
                raise ForestError(f"model {m.key}: depth {m.depth}")
            if not np.isfinite(m.base):
                raise ForestError(f"model {m.key}: base score is not finite")
        if tree0 != len(self.roots) or node0 != n:
            raise ForestError("trees or nodes that belong to no model")

    # --------------------------------------------------------------------------- building
    @classmethod
    def from_tables(cls, tables: Sequence[TreeTable], keys: "Sequence[str] | None" = None) -> "Forest":
        """The forest of per-model tree tables (format-1 bundles, fresh fits)."""
        keys = list(keys) if keys is not None else [str(i) for i in range(len(tables))]
        if len(keys) != len(tables):
            raise ValueError("one key per table")
        recs, roots, models = [], [], []
        node0 = tree0 = 0
        for key, t in zip(keys, tables):
            try:
                rec, r, depth = _relayout(t)
            except ForestError as exc:
                raise ForestError(f"model {key}: {exc}", key) from None
            # Records point at model-local nodes: shift ``next`` (word 1's high bits) to global.
            rec.view(np.int64)[1::2] += node0 << FEATURE_BITS
            recs.append(rec)
            roots.append(r + node0)
            models.append(ForestModel(key, tree0, len(r), node0, len(rec), depth, float(t.base),
                                      bool(t.float32), int(t.n_features)))
            node0 += len(rec)
            tree0 += len(r)
        records = np.concatenate(recs) if recs else np.zeros(0, _RECORD)
        return cls(records, np.concatenate(roots) if roots else np.zeros(0, np.intp), models)

    def to_bytes(self) -> bytes:
        """The forest file: magic, a JSON header, then the records and the roots (little-endian)."""
        header = {"format": FOREST_FORMAT, "nodes": len(self.records), "trees": len(self.roots),
                  "models": [{"key": m.key, "first_tree": m.first_tree, "trees": m.trees,
                              "first_node": m.first_node, "nodes": m.nodes, "depth": m.depth,
                              "base": m.base, "float32": m.float32, "n_features": m.n_features}
                             for m in self.models]}
        head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
        start = _data_offset(len(head))
        out = bytearray(start)
        out[:_HEAD.size + len(head)] = _HEAD.pack(FOREST_MAGIC, len(head)) + head
        out += self.records.astype(_RECORD, copy=False).tobytes()
        out += self.roots.astype("<i4").tobytes()
        return bytes(out)

    @classmethod
    def from_buffer(cls, buf: "bytes | bytearray | memoryview | np.ndarray") -> "Forest":
        """A forest file's bytes, viewed in place (no copy: keep ``buf`` unchanged afterwards)."""
        raw = np.frombuffer(buf, dtype=np.uint8)
        if len(raw) < _HEAD.size:
            raise ForestError("truncated forest file")
        magic, hlen = _HEAD.unpack(raw[:_HEAD.size].tobytes())
        if magic != FOREST_MAGIC:
            raise ForestError("not a forest file (bad magic)")
        if hlen > MAX_HEADER_BYTES or _HEAD.size + hlen > len(raw):
            raise ForestError("truncated forest file (header)")
        try:
            header = json.loads(raw[_HEAD.size:_HEAD.size + hlen].tobytes().decode("utf-8"))
            if header.get("format") != FOREST_FORMAT:
                raise ForestError(f"forest format {header.get('format')!r} is not supported "
                                  f"(this perfcast reads format {FOREST_FORMAT})")
            n_nodes, n_trees = _count(header["nodes"]), _count(header["trees"])
            models = [ForestModel(str(m["key"]), _count(m["first_tree"]), _count(m["trees"]),
                                  _count(m["first_node"]), _count(m["nodes"]), _count(m["depth"]),
                                  float(m["base"]), _flag(m["float32"]), _count(m["n_features"]))
                      for m in header["models"]]
        except ForestError:
            raise
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError,
                AttributeError) as exc:
            raise ForestError(f"bad forest header ({type(exc).__name__}: {exc})") from None
        start = _data_offset(hlen)
        end = start + 16 * n_nodes + 4 * n_trees
        if len(raw) != end:
            raise ForestError(f"forest file is {len(raw)} bytes, its header says {end}")
        records = raw[start:start + 16 * n_nodes].view(_RECORD)
        roots = raw[start + 16 * n_nodes:end].view("<i4")
        return cls(records, roots, models)

    # --------------------------------------------------------------------------- evaluating
    def predict(self, requests: Sequence[tuple[int, np.ndarray]]) -> list[np.ndarray]:
        """Raw model outputs for each (model index, rows × features) request."""
        if not requests:
            return []
        blocks, model_of_row = [], []
        for mi, X in requests:
            X = np.asarray(X, dtype=np.float64)
            if X.ndim != 2:
                X = X.reshape(len(X), -1)
            m = self.models[mi]
            if X.shape[1] != m.n_features:
                raise ValueError(f"model {m.key}: rows of {X.shape[1]} features, the model has {m.n_features}")
            blocks.append(X)
            model_of_row.extend([mi] * len(X))
        X_all = np.full((len(model_of_row), MAX_FEATURES), np.inf)
        a = 0
        for X in blocks:
            X_all[a:a + len(X), :X.shape[1]] = X
            a += len(X)
        sums = self.predict_rows(model_of_row, X_all)
        out, a = [], 0
        for X in blocks:
            out.append(sums[a:a + len(X)])
            a += len(X)
        return out

    def row_models(self, model_of_row: Sequence[int]) -> RowModels:
        """The per-row model arrays of :meth:`predict_rows` for ``model_of_row``."""
        mods = np.asarray(model_of_row, dtype=np.intp)
        f32 = self._float32[mods]
        return RowModels(mods, self._first_tree64[mods], self._trees64[mods], self._depth64[mods],
                         self._base[mods], f32[:, None] if f32.any() else None)

    def predict_rows(self, model_of_row: Union[Sequence[int], RowModels], X: np.ndarray) -> np.ndarray:
        """Raw outputs of many rows at once, in their order: row i by model ``model_of_row[i]``
        on ``X[i]`` (rows × up to :data:`MAX_FEATURES` columns; a model reads its first
        ``n_features``, the rest are ignored).  The caller gives each row the features its model
        was fitted on (:meth:`predict` checks that for you).  ``model_of_row`` may be
        :meth:`row_models`' answer for it, kept from an earlier call."""
        rows = model_of_row if isinstance(model_of_row, RowModels) else self.row_models(model_of_row)
        n_units = len(rows.mods)
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or len(X) != n_units or X.shape[1] > MAX_FEATURES:
            raise ValueError(f"rows × at most {MAX_FEATURES} features, one model per row: got "
                             f"{X.shape} for {n_units} models")
        if n_units == 0:
            return np.zeros(0)
        if _FOREST_SUMS is not None:
            return self._sums_c(rows, X)
        return self._sums_numpy(rows.mods, X)

    def _sums_numpy(self, mods: np.ndarray, X: np.ndarray) -> np.ndarray:
        """:meth:`predict_rows` in numpy: every (row, tree) pair one level deeper per step."""
        n_units = len(mods)
        # Deeper models first: step s then works on a prefix, the pairs of models deeper than s.
        order = np.argsort(-self._depth[mods], kind="stable")
        mods = mods[order]
        f32 = self._float32[mods]
        X_all = self._walk_rows(X[order], f32[:, None] if f32.any() else None)
        per_unit = self._trees[mods]
        ends = np.cumsum(per_unit)
        n_pairs = int(ends[-1])
        out = np.empty(n_units)
        if n_pairs == 0:
            out[order] = self._base[mods]
            return out
        unit = np.repeat(np.arange(n_units, dtype=np.intp), per_unit)              # unit per pair
        # int32 throughout the walk (fewer bytes per step than int64): every index fits, see _validate.
        node = self.roots[np.arange(n_pairs, dtype=np.intp)
                          + np.repeat(self._first_tree[mods] - (ends - per_unit), per_unit)]
        rowbase = (unit << FEATURE_BITS).astype(np.int32)
        flat = X_all.ravel()
        records = self.records
        depths, prefix = self._depth[mods].tolist(), ends.tolist()
        j = n_units
        for step in range(depths[0]):
            # the pairs of models deeper than ``step``: a prefix, as rows are sorted by depth
            while depths[j - 1] <= step:
                j -= 1
            k = prefix[j - 1]
            nd = node[:k]
            rec = records.take(nd)
            # word 1's low half (little-endian): the whole word, as every word is < 2**31
            word = rec.view(_WORD_LOW)[2::4]
            x = flat.take(rowbase[:k] + (word & LEAF_FEATURE))
            np.add(word >> FEATURE_BITS, x < rec.real, out=nd)
        # bincount adds each unit's leaves in pair order: tree by tree, as the libraries do; the
        # base score comes last.
        sums = np.bincount(unit, weights=records.take(node).real, minlength=n_units)
        sums += self._base[mods]
        out[order] = sums
        return out

    @staticmethod
    def _walk_rows(X: np.ndarray, float32_rows: Optional[np.ndarray]) -> np.ndarray:
        """The rows as both walks read them: :data:`COLUMNS` wide, +inf past the features (the
        leaf column LEAF_FEATURE among them), rounded to float32 where ``float32_rows`` (rows × 1)."""
        k = X.shape[1]
        X_all = np.empty((len(X), COLUMNS))
        X_all[:, k:] = np.inf
        X_all[:, :k] = X
        if float32_rows is not None:
            # XGBoost compares in float32: the row rounded to float32, then widened exactly.
            np.copyto(X_all, X_all.astype(np.float32), where=float32_rows)
        return X_all

    def _sums_c(self, rows: RowModels, X: np.ndarray) -> np.ndarray:
        """:meth:`predict_rows` by the C walk: the same comparisons and the same order of sums,
        so the same bits (tests/predictor/test_forest.py checks the two walks agree)."""
        X_all = self._walk_rows(X, rows.float32)
        out = np.empty(len(rows.mods))
        _FOREST_SUMS(self.records, self.roots, rows.first_tree, rows.trees, rows.depth, X_all, out)
        out += rows.base
        return out


def _data_offset(header_len: int) -> int:
    return -(-(_HEAD.size + header_len) // _ALIGN) * _ALIGN


def _count(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v >= 1 << 40:
        raise ForestError(f"bad count {v!r} in the forest header")
    return v


def _flag(v: object) -> bool:
    if not isinstance(v, bool):
        raise ForestError(f"bad flag {v!r} in the forest header")
    return v
