"""The record spool on a full disk: each lost record is counted once, and no empty segment is left
behind (the daemon's side, RecordSpool, and the writer's, _Writer, without a daemon)."""
from __future__ import annotations

import errno
import os
import time

from slurm_plugin.daemon import recorder as recorder_mod
from slurm_plugin.records import PredictionRecord, RecordStore, new_record_id


def _record() -> PredictionRecord:
    return PredictionRecord(record_id=new_record_id(), created=time.time(), partition="gpu", platform="p",
                            bundle="b", job={"fake": 1}, iteration_seconds=1.0, iterations=10,
                            total_seconds=70.0, interval_seconds=(0.9, 1.1), action="set", policy="fill")


class _Disk:
    """os.write for the spool's files: ``room`` bytes more fit, then writes are cut short (what a
    full disk does to a write that straddles the last free block), then refused."""

    def __init__(self, room: int):
        self.room = room
        self.real = os.write

    def write(self, fd: int, data: bytes) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = min(len(data), self.room)
        self.room -= n
        return self.real(fd, data[:n])


def _store_all(path: str) -> RecordStore:
    store = RecordStore(path)
    recorder_mod._Writer(store, recorder_mod.spool_dir(path)).drain(None)
    return store


def test_a_record_cut_by_a_full_disk_is_counted_lost_once(tmp_path, monkeypatch):
    path = str(tmp_path / "records.db")
    spool = recorder_mod.RecordSpool(path)
    spool.open()
    assert spool.append(_record())
    disk = _Disk(room=40)                       # the next record's line is cut 40 bytes in
    monkeypatch.setattr(recorder_mod.os, "write", disk.write)
    assert not spool.append(_record())
    assert not spool.append(_record())          # refused outright: the disk is full
    monkeypatch.undo()
    assert dict(spool.lost) == {"unwritable": 2}
    assert spool.append(_record())              # room again: the losses' line goes first
    spool.close_segment()
    store = _store_all(path)
    assert store.losses() == {"unwritable": 2}  # not also a "truncated" for the cut line
    assert store.count() == 2


def test_a_full_disk_leaves_no_empty_segments(tmp_path, monkeypatch):
    path = str(tmp_path / "records.db")
    spool = recorder_mod.RecordSpool(path)
    spool.open()
    monkeypatch.setattr(recorder_mod.os, "write", _Disk(room=0).write)
    for _ in range(5):
        assert not spool.append(_record())
    monkeypatch.undo()
    assert os.listdir(spool.dir) == []
    assert dict(spool.lost) == {"unwritable": 5}
