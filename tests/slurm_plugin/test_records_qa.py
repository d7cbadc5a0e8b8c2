"""QA (admin), findings 4 and 5: what a damaged or misplaced record store is called.

4. A corrupt store's line points to recovering its rows (docs/harvest.md, "When the store is
   damaged"), never to moving it aside, which costs every record not harvested yet -- in every line
   that says it: an open, ``check``'s quick_check, ``perf-calibrate report``.
5. When SQLite cannot open the store, the line names the real cause the file system shows: a
   directory in the store's place, a read-only file system, a directory it may not write.
"""
from __future__ import annotations

import os
import sqlite3

import pytest

from slurm_plugin import records
from slurm_plugin.records import DAMAGED_ADVICE, RecordStore, RecordStoreError

from .test_records import make_record

ADVICE = "recover what it holds before replacing it (docs/harvest.md, 'When the store is damaged')"


def _error(fn) -> str:
    return str(pytest.raises(RecordStoreError, fn).value)


def test_a_corrupt_store_is_told_to_be_recovered_not_moved_aside(tmp_path):
    path = tmp_path / "bad.sqlite"
    path.write_bytes(bytes(range(256)) * 32)       # not SQLite: "file is not a database"
    assert DAMAGED_ADVICE == ADVICE
    for store in (RecordStore(path), RecordStore(path, create=False)):
        for call in (store.check, store.count, lambda: store.add(make_record())):
            err = _error(call)
            assert err == (f"{path}: corrupt or not a perfcast record store (file is not a database): "
                           f"{ADVICE}")


def test_a_store_failing_its_quick_check_is_told_to_be_recovered(tmp_path, monkeypatch):
    path = tmp_path / "r.sqlite"
    RecordStore(path).add(make_record())

    class Checked:
        def execute(self, sql):
            return [("*** in database main ***",), ("Page 7: btreeInitPage() returns error code 11",)]

        def close(self):
            pass
    monkeypatch.setattr(records.sqlite3, "connect", lambda *a, **k: Checked())
    err = _error(RecordStore(path).check)
    assert err.startswith(f"{path}: corrupt (*** in database main ***; Page 7") and err.endswith(f": {ADVICE}")
    assert "move it aside" not in err


def test_perf_calibrate_report_says_the_same(tmp_path, capsys):
    from calibrate.cli import main
    bad, folder = tmp_path / "bad.sqlite", tmp_path / "dir.sqlite"
    bad.write_bytes(bytes(range(256)) * 32)
    folder.mkdir()
    assert main(["report", "--records", str(bad)]) == 2
    err = capsys.readouterr().err
    assert ADVICE in err and "move it aside" not in err
    assert main(["report", "--records", str(folder)]) == 2
    assert capsys.readouterr().err.strip() == (f"perf-calibrate: {folder}: is a directory "
                                               "(unable to open database file)")


def test_a_directory_in_the_stores_place_is_called_one(tmp_path):
    path = tmp_path / "dir.sqlite"
    path.mkdir()
    for store in (RecordStore(path), RecordStore(path, create=False)):
        assert _error(store.check) == f"{path}: is a directory (disk I/O error)"
        assert _error(store.count) == f"{path}: is a directory (unable to open database file)"


def _Cannot(text: str):
    """RecordStore._connect as SQLite fails it with ``text`` (on a read-only file system, say)."""
    def connect(store):
        raise sqlite3.OperationalError(text)
    return connect


@pytest.mark.parametrize("sqlite_says", ["unable to open database file", "disk I/O error",
                                         "attempt to write a readonly database"])
def test_a_read_only_file_system_is_called_one(tmp_path, monkeypatch, sqlite_says):
    path = tmp_path / "records.sqlite"
    RecordStore(path).count()
    real = os.statvfs

    def statvfs(p):
        got = real(p)
        if str(p).startswith(str(tmp_path)):       # the tester's read-only bind mount, without a mount
            return os.statvfs_result((*got[:8], got.f_flag | os.ST_RDONLY, got.f_namemax))
        return got
    monkeypatch.setattr(os, "statvfs", statvfs)
    monkeypatch.setattr(RecordStore, "_connect", _Cannot(sqlite_says))
    for store in (RecordStore(path), RecordStore(path, create=False)):
        assert _error(store.count) == f"{path}: read-only file system ({sqlite_says})"


def test_a_directory_it_may_not_write_is_named(tmp_path, monkeypatch):
    # (a reader that is not root, say: SQLite makes the -shm file beside the store, readers too)
    path = tmp_path / "records.sqlite"
    RecordStore(path).count()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: not (str(p) == str(tmp_path) and mode & os.W_OK)
                        and real(p, mode))
    monkeypatch.setattr(RecordStore, "_connect", _Cannot("unable to open database file"))
    assert _error(RecordStore(path, create=False).count) == (
        f"{path}: directory {tmp_path} not writable (permissions) (unable to open database file)")


def test_an_unexplained_failure_keeps_sqlites_words(tmp_path, monkeypatch):
    path = tmp_path / "records.sqlite"
    RecordStore(path).count()
    monkeypatch.setattr(RecordStore, "_connect", _Cannot("unable to open database file"))
    assert _error(RecordStore(path).count) == (f"{path}: cannot open (missing directory or permissions) "
                                               "(unable to open database file)")
    monkeypatch.setattr(RecordStore, "_connect", _Cannot("disk I/O error"))
    assert _error(RecordStore(path).count) == f"{path}: disk I/O error"
