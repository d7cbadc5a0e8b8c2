"""scripts/prediction_fingerprint.py's comparison: a changed number is found, and with --common-keys
an output that only gained keys is not (the full fingerprint is a script run, not a test)."""
from __future__ import annotations

import json

from scripts.prediction_fingerprint import GRID_GLOBAL_BATCH, GRID_GPUS, compare, grid_layouts


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_changed_last_bit_is_a_difference(tmp_path, capsys):
    a = _write(tmp_path / "a.jsonl", [{"id": "x", "prediction": {"iteration_seconds": 0.1 + 0.2}}])
    b = _write(tmp_path / "b.jsonl", [{"id": "x", "prediction": {"iteration_seconds": 0.3}}])
    assert compare(a, b) == 1
    assert "iteration_seconds: 0.30000000000000004 -> 0.3" in capsys.readouterr().out
    assert compare(a, a) == 0


def test_gained_keys_are_listed_not_compared_with_common_keys(tmp_path, capsys):
    a = _write(tmp_path / "a.jsonl", [{"id": "x", "prediction": {"breakdown": {"bubble": 1.5}}}])
    b = _write(tmp_path / "b.jsonl", [{"id": "x", "prediction": {"breakdown": {"bubble": 1.5,
                                                                              "bubble_seconds": 1.5}}}])
    assert compare(a, b) == 1
    assert compare(a, b, common_keys=True) == 0
    assert "prediction.breakdown.bubble_seconds" in capsys.readouterr().out
    c = _write(tmp_path / "c.jsonl", [{"id": "x", "prediction": {"breakdown": {"bubble": 1.25}}}])
    assert compare(a, c, common_keys=True) == 1


def test_a_missing_prediction_is_a_difference(tmp_path):
    a = _write(tmp_path / "a.jsonl", [{"id": "x", "error": "E"}, {"id": "y", "error": "E"}])
    b = _write(tmp_path / "b.jsonl", [{"id": "x", "error": "E"}])
    assert compare(a, b) == 1


def test_grid_layouts_fill_the_gpus_and_the_batch():
    layouts = list(grid_layouts(GRID_GPUS, GRID_GLOBAL_BATCH))
    assert len(layouts) > 100
    for lay in layouts:
        assert lay["pp"] * lay["tp"] * lay["dp"] == GRID_GPUS
        assert lay["dp"] * lay["micro_batch"] * lay["micro_batches"] == GRID_GLOBAL_BATCH
