"""A sample CSV whose last line has no newline (a writer killed mid-row) is read the way ``run``
repairs it: the line is dropped with a warning naming the file and line (QA finding 3).

``fit`` used to read ``...,113.6359,3`` (a backward time cut from 35.x µs to 3 µs) as a sample.
"""
from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest

from calibrate.store import repair_torn_tail
from predictor.samples import load_samples

from .test_fit_host_table import _fit, _gpu_store


def _tear(path, keep_chars: int) -> tuple[int, str]:
    """Cut the file's last row to its first ``keep_chars`` characters, newline gone; returns the
    line number of that row and the whole row as it was."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    last = lines[-1]
    path.write_text("".join(lines[:-1]) + last[:keep_chars], encoding="utf-8")
    return len(lines), last


def test_a_torn_last_row_that_parses_is_dropped_with_a_warning(tmp_path, caplog):
    store = _gpu_store(tmp_path)
    path = store / "operators" / "gelu_fp16.csv"
    whole = load_samples(store).operators[("gelu", "fp16")]
    last = path.read_text(encoding="utf-8").splitlines()[-1]
    lineno, _ = _tear(path, len(last) - 3)
    torn = path.read_text(encoding="utf-8").splitlines()[-1]
    assert torn.count(",") == last.count(",") and torn != last     # every value there, the last cut short
    before = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="predictor.samples"):
        table = load_samples(store).operators[("gelu", "fp16")]
    assert len(table) == len(whole) - 1
    assert np.array_equal(table.rows, whole.rows[:-1])
    assert f"{path}:{lineno}: dropped a torn last line" in caplog.text
    assert path.read_bytes() == before          # reading never rewrites a sample file


def test_a_torn_row_is_read_as_run_repairs_it(tmp_path, caplog):
    # Fewer values than the header (it used to be refused, ":N: expected 3 values, found 1"):
    # dropped too, as `run` drops it before resuming; fit and run agree on the same file.
    store = _gpu_store(tmp_path)
    path = store / "operators" / "res_add_fp16.csv"
    lineno, _ = _tear(path, 3)
    with caplog.at_level(logging.WARNING, logger="predictor.samples"):
        torn = load_samples(store).operators[("res_add", "fp16")]
    assert f"{path}:{lineno}: dropped a torn last line" in caplog.text
    repaired = tmp_path / "repaired"
    shutil.copytree(store, repaired)
    assert repair_torn_tail(repaired / "operators" / "res_add_fp16.csv")
    assert np.array_equal(torn.rows, load_samples(repaired).operators[("res_add", "fp16")].rows)


def test_a_whole_file_reads_without_a_word(tmp_path, caplog):
    store = _gpu_store(tmp_path)
    with caplog.at_level(logging.WARNING, logger="predictor.samples"):
        load_samples(store)
    assert "torn" not in caplog.text


def test_fit_says_it_dropped_the_torn_row(tmp_path):
    # In a fresh process, as the admin runs it: the CLI shows the warning (logging), one line.
    store = _gpu_store(tmp_path)
    path = store / "operators" / "gelu_fp16.csv"
    rows = len(load_samples(store).operators[("gelu", "fp16")])
    lineno, _ = _tear(path, 12)
    res = _fit(store, tmp_path / "plat")
    assert res.returncode == 0, res.stderr
    assert f"{path}:{lineno}: dropped a torn last line" in res.stderr
    assert "Traceback" not in res.stderr
    total = rows - 1 + len(load_samples(store).operators[("res_add", "fp16")])
    assert f"({total} samples)" in res.stdout


@pytest.mark.parametrize("text", ["", "x"])
def test_a_file_that_is_only_a_torn_header_is_refused(tmp_path, text):
    store = _gpu_store(tmp_path)
    (store / "operators" / "gelu_fp16.csv").write_text(text)
    from predictor.errors import BundleError
    with pytest.raises(BundleError, match="gelu_fp16.csv: empty sample file"):
        load_samples(store)
