"""calibrate/host_link.py: the copies it times, and the shipped pageable rates are its summary of the
committed measurement."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from predictor import checkpointing

HOST_LINK = (Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h100-lent" / "host-link"
             / "host-link.json")


def _host_link():
    """calibrate.host_link, skipping the test (alone) where torch is absent."""
    pytest.importorskip("torch", reason="the host-link copies run torch (the calibrate extra)")
    from calibrate import host_link
    return host_link


def test_slowest_gbps_takes_each_copys_slowest_size_to_three_figures():
    host_link = _host_link()
    rows = [{"copy": "d2h_pageable", "gbps": 1.7712}, {"copy": "d2h_pageable", "gbps": 1.9},
            {"copy": "h2d_pinned", "gbps": 25.04}, {"copy": "h2d_pinned", "gbps": 24.96}]
    assert host_link.slowest_gbps(rows) == {"d2h_pageable": 1.77, "h2d_pinned": 25.0}


def test_the_shipped_pageable_rates_are_the_committed_measurements_slowest():
    host_link = _host_link()
    rates = host_link.slowest_gbps(json.loads(HOST_LINK.read_text())["rows"])
    assert (rates["d2h_pageable"], rates["h2d_pageable"]) == (checkpointing.PAGEABLE_D2H_GBPS,
                                                              checkpointing.PAGEABLE_H2D_GBPS)


def test_measure_times_every_copy_of_every_size_on_a_cpu():
    host_link = _host_link()
    seen = []
    out = host_link.measure("cpu", [1, 2], repeats=2, on_row=lambda row, mib: seen.append((row["copy"], mib)))
    assert seen == [(c, mib) for mib in (1, 2) for c in host_link.COPIES]
    assert [r["bytes"] for r in out["rows"]] == [2**20] * 4 + [2 * 2**20] * 4
    for r in out["rows"]:
        assert r["seconds"] > 0 and r["gbps"] == pytest.approx(r["bytes"] / r["seconds"] / 1e9)
    assert out["sync_round_trip_seconds"] >= 0
