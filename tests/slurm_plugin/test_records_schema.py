"""slurm_plugin.records: a store of an older schema (a site's real records) is upgraded in place;
one of a newer schema is refused with a clear line."""
from __future__ import annotations

import json
import multiprocessing
import sqlite3

import pytest

from slurm_plugin import records
from slurm_plugin.records import JobOutcome, RecordStore, RecordStoreError

from .test_records import JOB, make_record

# The tables as perfcast created them before std_err (schema 1): a frozen copy, not derived from
# records._SCHEMA (which moves on with every later schema).
SCHEMA_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE records (seq INTEGER PRIMARY KEY AUTOINCREMENT, record_id TEXT NOT NULL UNIQUE,
    created REAL NOT NULL, partition TEXT NOT NULL, platform TEXT NOT NULL, bundle TEXT NOT NULL,
    job_json TEXT NOT NULL, iteration_seconds REAL NOT NULL, iterations INTEGER NOT NULL,
    total_seconds REAL NOT NULL, interval_lo REAL NOT NULL, interval_hi REAL NOT NULL,
    time_limit_minutes INTEGER, time_min_minutes INTEGER, recommended_minutes INTEGER,
    action TEXT NOT NULL, policy TEXT NOT NULL, std_out TEXT NOT NULL, work_dir TEXT NOT NULL,
    job_name TEXT NOT NULL, uid INTEGER, gid INTEGER, user TEXT NOT NULL, slurm_job_id INTEGER);
CREATE INDEX records_created ON records (partition, created);
CREATE INDEX records_job ON records (slurm_job_id);
CREATE TABLE outcomes (record_id TEXT PRIMARY KEY, slurm_job_id INTEGER NOT NULL, state TEXT NOT NULL,
    elapsed_seconds REAL, time_limit_seconds REAL, start REAL, "end" REAL, nodes INTEGER,
    exit_code TEXT NOT NULL, measured_iteration_seconds REAL, log_format TEXT NOT NULL,
    log_samples INTEGER NOT NULL, note TEXT NOT NULL, source TEXT NOT NULL, harvested REAL NOT NULL);
CREATE INDEX outcomes_job ON outcomes (slurm_job_id);
"""
OLD_ID = "0123456789ab"


def make_v1_store(path, n: int = 1, schema: str = "1") -> list[str]:
    """A schema-1 store as an older perfcast left it (WAL, a harvested record among n); its ids."""
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.executescript(SCHEMA_1)
        con.execute("INSERT INTO meta (key, value) VALUES ('schema', ?)", (schema,))
        con.execute("INSERT INTO meta (key, value) VALUES ('lost:unwritable', '3')")
        ids = [OLD_ID] + [f"{i:012x}" for i in range(1, n)]
        for i, rid in enumerate(ids):
            con.execute(
                "INSERT INTO records (record_id, created, partition, platform, bundle, job_json, "
                "iteration_seconds, iterations, total_seconds, interval_lo, interval_hi, time_limit_minutes, "
                "time_min_minutes, recommended_minutes, action, policy, std_out, work_dir, job_name, uid, gid, "
                "user, slurm_job_id) VALUES (?, ?, 'gpu', 'dgx-a100', 'a100@1', ?, 1.5, 500, 870.0, 1.3, 1.9, "
                "25, 20, 25, 'set', 'fill', 'train-%j.out', '/home/alice/run', ?, 1001, 1001, 'alice', ?)",
                (rid, 1_714_557_600.0 + i, json.dumps(JOB, sort_keys=True), f"old{i}", 100 + i))
        con.execute("INSERT INTO outcomes VALUES (?, 100, 'COMPLETED', 800.0, 1500.0, NULL, NULL, 2, '0:0', "
                    "1.52, 'megatron', 30, '', 'sacct', 1714560000.0)", (OLD_ID,))
        con.commit()
    finally:
        con.close()
    return ids


def columns(path) -> list[str]:
    with sqlite3.connect(path) as con:
        return [r[1] for r in con.execute("PRAGMA table_info(records)")]


def schema_of(path) -> str:
    with sqlite3.connect(path) as con:
        return con.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0]


def test_a_schema_1_store_is_upgraded_in_place_and_keeps_its_records(tmp_path, caplog):
    path = tmp_path / "records.sqlite"
    make_v1_store(path)
    store = RecordStore(path, create=False)          # as the harvest and the report open it
    with caplog.at_level("INFO", logger="perfcast.records"):
        old = store.get(OLD_ID)
    # an event like every other line of the record writer's log (QA 7)
    (line,) = [r.getMessage() for r in caplog.records if "upgraded" in r.getMessage()]
    assert line.startswith("event=record_store_upgraded store=") and line.endswith(" from_schema=1 to_schema=2")
    assert old is not None and old.std_err == "" and old.std_out == "train-%j.out"
    assert (old.job, old.slurm_job_id, old.interval_seconds, old.job_name) == (JOB, 100, (1.3, 1.9), "old0")
    (rec, out), = store.outcomes()
    assert rec.record_id == OLD_ID and out.measured_iteration_seconds == 1.52 and out.log_format == "megatron"
    assert store.losses() == {"unwritable": 3}
    assert schema_of(path) == str(records.SCHEMA_VERSION) == "2"
    assert columns(path).count("std_err") == 1
    # New records carry std_err, next to the old one; another open finds nothing left to do.
    rid = store.add(make_record(std_err="train-%j.err"))
    store.put_outcome(JobOutcome(record_id=rid, slurm_job_id=101, state="TIMEOUT"))
    again = RecordStore(path, create=False)
    assert [(r.record_id, r.std_err) for r in again.find()] == [(OLD_ID, ""), (rid, "train-%j.err")]
    assert [o.slurm_job_id for _, o in again.outcomes()] == [100, 101]
    assert columns(path).count("std_err") == 1
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_fresh_store_has_the_columns_of_an_upgraded_one(tmp_path):
    make_v1_store(tmp_path / "old.sqlite")
    RecordStore(tmp_path / "old.sqlite").count()
    RecordStore(tmp_path / "new.sqlite").count()
    assert columns(tmp_path / "old.sqlite") == columns(tmp_path / "new.sqlite")
    assert schema_of(tmp_path / "new.sqlite") == "2"


def _open_and_add(path: str, tag: int) -> None:
    store = RecordStore(path, create=False)
    for i in range(5):
        store.add(make_record(job_name=f"w{tag}", std_err=f"e{tag}-{i}.err"))


def test_processes_opening_a_schema_1_store_at_once_upgrade_it_once(tmp_path):
    path = str(tmp_path / "records.sqlite")
    old = make_v1_store(path, n=20)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_open_and_add, args=(path, t)) for t in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    rows = RecordStore(path).find()
    assert [r.record_id for r in rows[:20]] == old and all(r.std_err == "" for r in rows[:20])
    assert len(rows) == 40 and sorted({r.job_name for r in rows[20:]}) == ["w0", "w1", "w2", "w3"]
    assert all(r.std_err.startswith("e") for r in rows[20:])
    assert schema_of(path) == "2" and columns(path).count("std_err") == 1


class _ReadOnly(RecordStore):
    """A store opened by a process that may read the file but not write it (an admin's report of
    the daemon's file, say)."""

    def _connect(self):
        return sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=0.5, isolation_level=None)


def test_a_reader_that_cannot_write_says_so_and_leaves_the_store_as_it_was(tmp_path):
    path = tmp_path / "records.sqlite"
    make_v1_store(path)
    err = str(pytest.raises(RecordStoreError, _ReadOnly(path, create=False).find).value)
    assert str(path) in err and "not writable" in err and "schema 2" in err and "record writer" in err
    assert "\n" not in err
    assert schema_of(path) == "1" and "std_err" not in columns(path)
    assert RecordStore(path, create=False).get(OLD_ID).job_name == "old0"     # a writer then upgrades it


@pytest.mark.parametrize("schema", ["3", "10", "0", "v1"])
def test_a_store_of_an_unknown_schema_is_refused_untouched(tmp_path, schema):
    newer = " (the store was written by a newer perfcast: upgrade this one)" if schema in ("3", "10") else ""
    expect = f"record store schema {schema}, this perfcast reads 2{newer}"
    path = tmp_path / "records.sqlite"
    make_v1_store(path, schema=schema)
    for store in (RecordStore(path), RecordStore(path, create=False)):
        err = str(pytest.raises(RecordStoreError, store.add, make_record()).value)
        assert expect in err and str(path) in err and "\n" not in err
    assert err.endswith(expect) and schema_of(path) == schema and "std_err" not in columns(path)


def test_a_store_without_a_schema_row_says_so_not_schema_question_mark(tmp_path):
    """QA 7: a meta table without its schema row is no perfcast store, or a damaged one."""
    path = tmp_path / "records.sqlite"
    make_v1_store(path)
    with sqlite3.connect(path) as con:
        con.execute("DELETE FROM meta WHERE key = 'schema'")
    for store in (RecordStore(path), RecordStore(path, create=False)):
        err = str(pytest.raises(RecordStoreError, store.count).value)
        assert err == f"{path}: has no schema version: not a perfcast record store, or a damaged one"
