"""perf-calibrate fabric on one host with too few ranks for two groups fails at once, saying which
--ranks/--shapes would work (QA finding 7: its CPU default of 2 ranks measured for 7 s, then
failed with "more ranks, or --shapes").  No rank is started here: no test depends on speed.
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="calibrate.fabric needs torch (the calibrate extra)")

from calibrate import fabric  # noqa: E402
from calibrate.cli import main  # noqa: E402
from calibrate.errors import CalibrationError  # noqa: E402

from .conftest import one_line_error  # noqa: E402


@pytest.fixture
def spawned(monkeypatch):
    """Records each start of local ranks instead of starting them (they would measure nothing)."""
    calls = []
    monkeypatch.setattr(fabric, "spawn_ranks", lambda n, *a, **kw: calls.append(n))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    threads = fabric.torch.get_num_threads()      # run_fabric sets this process's share of the cores
    yield calls
    fabric.torch.set_num_threads(threads)


def test_the_cpu_default_fails_before_starting_a_rank_and_says_what_works(tmp_path, capsys, spawned):
    out = tmp_path / "fabric.toml"
    assert main(["fabric", "--device", "cpu", "--out", str(out)]) == 2
    one_line_error(capsys, "no group shape has room for two groups", "2 local ranks",
                   "the default --ranks", "--ranks 4 --shapes 1x2")
    assert spawned == [] and not out.exists()
    assert main(["fabric", "--device", "cpu", "--ranks", "3", "--out", str(out)]) == 2
    one_line_error(capsys, "3 local ranks", "--ranks 4 --shapes 1x2")
    assert spawned == []


def test_shapes_that_do_not_tile_the_ranks_are_refused_naming_one_that_does(spawned):
    with pytest.raises(CalibrationError, match=r"4 local ranks .*--shapes 2x1\).*use --shapes 1x2"):
        fabric.run_fabric("cpu", ranks=4, shapes=((2, 1),))
    assert spawned == []


@pytest.mark.parametrize("ranks, shapes", [(4, ()), (4, ((1, 2),)), (8, ((2, 1), (1, 4)))])
def test_ranks_with_room_for_two_groups_are_started(spawned, ranks, shapes):
    rows, doc = fabric.run_fabric("cpu", ranks=ranks, shapes=shapes)
    assert spawned == [ranks] and rows == [] and doc["fabric"]["gpus_per_node"] == ranks
