"""A record's --error (std_err) through the daemon's spool into the store, and an upgrade with
records in flight: spool lines of the previous perfcast (no std_err) stored into a schema-1 store
that the new writer upgrades."""
from __future__ import annotations

import json
import os
import time

from slurm_plugin.daemon import recorder as recorder_mod
from slurm_plugin.records import PredictionRecord, RecordStore, new_record_id

from ..slurm_plugin.test_records_schema import OLD_ID, make_v1_store


def _record(**kw) -> PredictionRecord:
    return PredictionRecord(record_id=new_record_id(), created=time.time(), partition="gpu", platform="p",
                            bundle="b", job={"fake": 1}, iteration_seconds=1.0, iterations=10,
                            total_seconds=70.0, interval_seconds=(0.9, 1.1), action="set", policy="fill",
                            std_out="o-%j.out", uid=os.geteuid(), **kw)


def test_spooled_std_err_reaches_an_upgraded_store_next_to_a_previous_daemons_lines(tmp_path):
    path = str(tmp_path / "records.sqlite")
    make_v1_store(path)
    spool = recorder_mod.RecordSpool(path)
    spool.open()
    # What the previous perfcast's daemon spooled before the upgrade: no std_err key at all.
    previous = _record().to_dict()
    del previous["std_err"]
    with open(os.path.join(spool.dir, f"{spool.seq:010d}.jsonl"), "w") as fh:
        fh.write(json.dumps({"r": previous}) + "\n")
    spool.seq += 1
    spliced, plain = _record(std_err="e-%j.err"), _record(std_err="/s/e-%A_%a.err")
    assert spool.append(spliced, recorder_mod.job_line_text(spliced.job))   # the request path's way
    assert spool.append(plain)
    spool.close_segment()
    store = RecordStore(path)
    recorder_mod._Writer(store, spool.dir).drain(None)
    got = {r.record_id: r.std_err for r in store.find()}
    assert got == {OLD_ID: "", previous["record_id"]: "", spliced.record_id: "e-%j.err",
                   plain.record_id: "/s/e-%A_%a.err"}
    assert store.losses() == {"unwritable": 3}          # the schema-1 store's own count, kept
