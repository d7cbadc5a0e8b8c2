"""slurm_plugin.records: the SQLite store of what perf-predictd answered (no Slurm needed)."""
from __future__ import annotations

import multiprocessing
import os
import sqlite3

import pytest

from slurm_plugin.records import (JobOutcome, PredictionRecord, RecordStore,
                                  RecordStoreError, is_record_id, new_record_id, parse_admin_comment,
                                  record_key)

JOB = {"model": {"layers": 8, "hidden": 4096, "heads": 32, "seq_len": 2048},
       "layout": {"pp": 2, "tp": 4, "dp": 2, "micro_batch": 2, "micro_batches": 8},
       "run": {"precision": "fp16", "train_iters": 500}}


def make_record(**kw) -> PredictionRecord:
    base = dict(partition="gpu", platform="dgx-a100", bundle="a100@1", job=JOB, iteration_seconds=1.5,
                iterations=500, total_seconds=870.0, interval_seconds=(1.3, 1.9), time_limit_minutes=25,
                time_min_minutes=20, recommended_minutes=25, action="set", policy="fill",
                std_out="train-%j.out", work_dir="/home/alice/run", job_name="gpt", uid=1001, gid=1001,
                user="alice")
    base.update(kw)
    return PredictionRecord(**base)


def test_add_get_find_roundtrip(tmp_path):
    store = RecordStore(tmp_path / "sub" / "records.sqlite")
    rid = store.add(make_record())
    assert is_record_id(rid)
    got = store.get(rid)
    assert got is not None and got.record_id == rid and got.job == JOB
    assert got.interval_seconds == (1.3, 1.9) and got.time_min_minutes == 20 and got.slurm_job_id is None
    assert got.created > 0
    other = store.add(make_record(partition="cpu", user="bob", uid=1002))
    assert [r.record_id for r in store.find(partition="gpu")] == [rid]
    assert [r.record_id for r in store.find(user="bob")] == [other]
    assert store.find(since=got.created + 3600) == []
    # The file is private to its owner: records name users and their output paths.
    assert oct(os.stat(store.path).st_mode & 0o777) == "0o600"
    assert store.get("not-an-id") is None and store.get("0" * 12) is None


def test_std_err_round_trips_through_every_way_in_and_out(tmp_path):
    store = RecordStore(tmp_path / "r.sqlite")
    rid = store.add(make_record(std_err="train-%j.err"))
    spooled = make_record(record_id=new_record_id(), std_err="/scratch/e-%A_%a.log")
    assert store.add_many([spooled]) == 1
    plain = store.add(make_record())
    assert store.get(rid).std_err == "train-%j.err" and store.get(rid).std_out == "train-%j.out"
    assert store.get(spooled.record_id).std_err == "/scratch/e-%A_%a.log"
    assert store.get(plain).std_err == ""                    # no --error: stderr went with stdout
    assert [r.std_err for r in store.find()] == ["train-%j.err", "/scratch/e-%A_%a.log", ""]
    store.put_outcome(JobOutcome(record_id=rid, slurm_job_id=7, state="COMPLETED"))
    (rec, _), = store.outcomes()
    assert rec.std_err == "train-%j.err" and rec.to_dict()["std_err"] == "train-%j.err"


def test_attach_job_and_outcome(tmp_path):
    store = RecordStore(tmp_path / "r.sqlite")
    rid = store.add(make_record())
    assert store.attach_job(rid, 42)
    assert not store.attach_job(rid, 43)           # a record belongs to one job
    assert store.find(slurm_job_id=42)[0].record_id == rid
    store.put_outcome(JobOutcome(record_id=rid, slurm_job_id=42, state="COMPLETED", elapsed_seconds=800.0,
                                 time_limit_seconds=1500.0, measured_iteration_seconds=1.52,
                                 log_format="megatron", log_samples=30, source="sacct"))
    (rec, out), = store.outcomes()
    assert rec.record_id == rid and out.state == "COMPLETED" and out.measured_iteration_seconds == 1.52
    assert store.outcome(rid).end is None
    with pytest.raises(RecordStoreError, match="no record"):
        store.put_outcome(JobOutcome(record_id=new_record_id(), slurm_job_id=1, state="FAILED"))
    with pytest.raises(RecordStoreError, match="elapsed_seconds"):
        store.put_outcome(JobOutcome(record_id=rid, slurm_job_id=42, state="FAILED", elapsed_seconds=float("nan")))


def test_bounded_oldest_pruned_with_their_outcomes(tmp_path):
    store = RecordStore(tmp_path / "r.sqlite", max_rows=10)
    ids = [store.add(make_record(iteration_seconds=float(i + 1))) for i in range(25)]
    store.put_outcome(JobOutcome(record_id=ids[-1], slurm_job_id=99, state="COMPLETED"))
    assert store.count() == 10
    assert [r.record_id for r in store.find()] == ids[-10:]
    assert store.get(ids[0]) is None
    # An outcome goes with its record.
    for i in range(10):
        store.add(make_record())
    assert store.outcomes() == []
    with sqlite3.connect(store.path) as con:
        assert con.execute("SELECT COUNT(*) FROM outcomes").fetchone()[0] == 0


def test_given_record_id_is_kept_and_a_duplicate_refused(tmp_path):
    store = RecordStore(tmp_path / "r.sqlite")
    rid = new_record_id()
    assert store.add(make_record(record_id=rid)) == rid
    with pytest.raises(RecordStoreError, match="already stored"):
        store.add(make_record(record_id=rid))


@pytest.mark.parametrize("change, field", [
    ({"iteration_seconds": float("nan")}, "iteration_seconds"),
    ({"total_seconds": -1.0}, "total_seconds"),
    ({"interval_seconds": (1.0,)}, "interval_seconds"),
    ({"iterations": 2.5}, "iterations"),
    ({"uid": -3}, "uid"),
    ({"std_out": "x" * 5000}, "std_out"),
    ({"std_err": "x" * 5000}, "std_err"),
    ({"std_err": "a\0b"}, "std_err"),
    ({"record_id": "../../etc"}, "record_id"),
    ({"job": {"model": {"x": float("inf")}}}, "job"),
    ({"job": {"blob": "y" * 70000}}, "job"),
])
def test_bad_record_is_refused_naming_the_field(tmp_path, change, field):
    store = RecordStore(tmp_path / "r.sqlite")
    with pytest.raises(RecordStoreError, match=f"record: {field}:"):
        store.add(make_record(**change))
    assert store.count() == 0


def _writer(path: str, n: int, tag: int) -> None:
    store = RecordStore(path)
    for i in range(n):
        store.add(make_record(iteration_seconds=1.0 + tag + i / 1000.0, job_name=f"w{tag}"))


def test_concurrent_writer_processes_lose_nothing(tmp_path):
    path = str(tmp_path / "r.sqlite")
    RecordStore(path).count()        # created once, as the daemon would
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, 40, t)) for t in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    store = RecordStore(path)
    rows = store.find()
    assert len(rows) == 160 and len({r.record_id for r in rows}) == 160
    assert sorted({r.job_name for r in rows}) == ["w0", "w1", "w2", "w3"]
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


class _SmallDisk(RecordStore):
    """A store whose file cannot grow past a few pages: SQLite answers SQLITE_FULL, exactly what a
    full disk gives it."""

    def _connect(self):
        con = super()._connect()
        con.execute("PRAGMA max_page_count = 12")
        return con


def test_full_disk_is_a_clear_error(tmp_path):
    store = _SmallDisk(tmp_path / "r.sqlite")
    with pytest.raises(RecordStoreError, match="disk full"):
        for i in range(500):
            store.add(make_record(std_out="/scratch/" + "d" * 3000 + f"/{i}"))
    err = str(pytest.raises(RecordStoreError, store.add, make_record(std_out="/x/" + "e" * 3000)).value)
    assert str(store.path) in err and "\n" not in err


def test_garbage_file_is_a_clear_error(tmp_path):
    path = tmp_path / "r.sqlite"
    path.write_bytes(b"this is not sqlite at all\n" * 100)
    with pytest.raises(RecordStoreError, match="corrupt or not a perfcast record store") as e:
        RecordStore(path).add(make_record())
    assert str(path) in str(e.value)
    with pytest.raises(RecordStoreError, match="corrupt"):
        RecordStore(path, create=False).find()


def test_damaged_pages_are_a_clear_error(tmp_path):
    path = tmp_path / "r.sqlite"
    store = RecordStore(path)
    for i in range(200):
        store.add(make_record(job_name=f"job{i}", std_out="/o/" + "p" * 200))
    with sqlite3.connect(path) as con:          # fold the WAL into the main file
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    assert len(data) > 6 * page
    for p in range(2, len(data) // page):       # every b-tree page header after the schema page
        data[p * page: p * page + 16] = b"\xff" * 16
    path.write_bytes(bytes(data))
    fresh = RecordStore(path)
    with pytest.raises(RecordStoreError, match="corrupt"):
        fresh.find()
        fresh.add(make_record())


def test_foreign_sqlite_file_is_refused_not_modified(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE accounts (id INTEGER)")
    with pytest.raises(RecordStoreError, match="not a perfcast record store"):
        RecordStore(path).add(make_record())
    with sqlite3.connect(path) as con:
        assert [r[0] for r in con.execute("SELECT name FROM sqlite_master")] == ["accounts"]


def test_a_store_follows_its_path_when_the_file_is_moved_aside(tmp_path):
    # What an admin does with a corrupt file while the daemon runs: the daemon's store object
    # starts a new file at the path instead of writing into the moved one.
    store = RecordStore(tmp_path / "r.sqlite")
    first = store.add(make_record())
    os.rename(store.path, tmp_path / "r.sqlite.bad")
    for suffix in ("-wal", "-shm"):
        if (tmp_path / f"r.sqlite{suffix}").exists():
            os.rename(tmp_path / f"r.sqlite{suffix}", tmp_path / f"r.sqlite.bad{suffix}")
    second = store.add(make_record())
    assert [r.record_id for r in store.find()] == [second] and store.get(first) is None
    assert [r.record_id for r in RecordStore(tmp_path / "r.sqlite.bad").find()] == [first]


def test_missing_store_without_create(tmp_path):
    with pytest.raises(RecordStoreError, match="no record store here"):
        RecordStore(tmp_path / "nope.sqlite", create=False).find()
    assert not (tmp_path / "nope.sqlite").exists()


def test_add_many_is_one_transaction_and_a_replay_stores_nothing_twice(tmp_path):
    store = RecordStore(tmp_path / "r.sqlite", max_rows=50)
    recs = [make_record(record_id=new_record_id(), job_name=f"j{i}") for i in range(60)]
    assert store.add_many(recs[:40]) == 40
    assert store.add_many(recs) == 20            # a spool replayed after a kill: the new ones only
    assert store.count() == 50                   # and the bound holds
    with pytest.raises(RecordStoreError, match="record_id"):
        store.add_many([make_record()])          # ids are the daemon's (already in an AdminComment)
    with pytest.raises(RecordStoreError, match="iteration_seconds"):
        store.add_many([make_record(record_id=new_record_id()), make_record(iteration_seconds=-1.0)])
    assert store.count() == 50                   # nothing of a refused batch was written


def test_losses_are_counted_by_reason(tmp_path):
    store = RecordStore(tmp_path / "r.sqlite")
    assert store.losses() == {}
    store.add_losses({"unwritable": 3, "truncated": 1, "spool-full": 0})
    store.add_losses({"unwritable": 2})
    assert store.losses() == {"unwritable": 5, "truncated": 1}


def test_check_finds_garbage_over_the_first_pages(tmp_path):
    path = tmp_path / "r.sqlite"
    store = RecordStore(path)
    for i in range(300):
        store.add(make_record(job_name=f"job{i}", std_out="/o/" + "p" * 200))
    store.check()                                # sound
    store.close()
    with sqlite3.connect(path) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[page: 3 * page] = os.urandom(2 * page)  # pages 2 and 3: the b-tree roots after the schema
    path.write_bytes(bytes(data))
    with pytest.raises(RecordStoreError, match="corrupt"):
        RecordStore(path).check()
    RecordStore(tmp_path / "absent.sqlite").check()   # nothing yet: fine


@pytest.mark.parametrize("text, expected", [
    ("perfcast:v1 iter_s=1.5 iters=500 total_min=14.5 platform=dgx-a100 bundle=a@1 policy=fill "
     "action=set rec_min=25 min_min=20 rec=0123456789ab",
     {"iter_s": "1.5", "iters": "500", "rec": "0123456789ab", "min_min": "20", "action": "set"}),
    ("site: project x; perfcast:v1 iter_s=2 iters=3 rec=abcdefabcdef | billed", {"iter_s": "2", "rec": "abcdefabcdef"}),
    ("perfcast:v1 iter_s=1 perfcast:v1 iter_s=9 rec=aaaaaaaaaaaa", {"iter_s": "9", "rec": "aaaaaaaaaaaa"}),
    ("perfcast:v1", {}),
    ("perfcast:v10 iter_s=1", {}),
    ("xperfcast:v1 iter_s=1", {}),
    ("no record here", {}),
    ("", {}),
    (None, {}),
])
def test_parse_admin_comment(text, expected):
    got = parse_admin_comment(text)
    assert {k: got.get(k) for k in expected} == expected
    if not expected:
        assert got == {}


def test_parse_admin_comment_stops_at_other_text_and_is_bounded():
    got = parse_admin_comment("perfcast:v1 iter_s=1 rec=0123456789ab note: iter_s=5 " + "x=y " * 100000)
    assert got == {"iter_s": "1", "rec": "0123456789ab"}
    assert parse_admin_comment("perfcast:v1 " + "k=" + "v" * 10000) == {}


def test_record_key():
    rid = new_record_id()
    assert record_key(rid) == f"rec={rid}"
    assert parse_admin_comment("perfcast:v1 iter_s=1 " + record_key(rid))["rec"] == rid
    with pytest.raises(ValueError):
        record_key("zz")


def test_report_shows_the_losses(tmp_path):
    from calibrate.report import Report
    store = RecordStore(tmp_path / "r.sqlite")
    store.add_losses({"unwritable": 4, "truncated": 1})
    rep = Report(record_losses=store.losses())
    assert "records perf-predictd could not keep: 5 (truncated 1, unwritable 4)" in rep.table()
    assert rep.to_dict()["record_losses"] == {"truncated": 1, "unwritable": 4}
    assert "could not keep" not in Report().table()
