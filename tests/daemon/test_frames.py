"""The daemon's frames to and from its workers, and the record line built from a worker's job text:
what crosses must come back exactly as it went (the request path's shortcuts change no byte)."""
from __future__ import annotations

import json
import math
import time

from slurm_plugin.daemon import Engine, PredictRequest
from slurm_plugin.daemon.engine import Outcome
from slurm_plugin.daemon.recorder import RecordSpool, job_line_text
from slurm_plugin.policy import PredictionFacts
from slurm_plugin.records import PredictionRecord
from slurm_plugin.siteconfig import load_site_config

from . import fakes
from .conftest import write_config

# Newlines, quotes, backslashes, non-ASCII and a lone surrogate: what JSON escaping used to carry.
SCRIPT = '#!/bin/bash\n#SBATCH -N 2\n# FAKE iters=1000 iter_s=2.4\necho "a\\b" \u00e9\udc80\nsrun x\n'


def test_a_request_reaches_the_worker_exactly_as_the_daemon_holds_it(tmp_path):
    eng = Engine(load_site_config(write_config(str(tmp_path))), fakes.BACKENDS).load(lookup_partitions=False)
    req = PredictRequest(script=SCRIPT, submit_uid=1000, submit_gid=1000, work_dir="/home/u\nx",
                         partition="gpu", argv=("/home/u/run.sh", "a\nb"), env={"X": "1\n2"},
                         name='n"1', time_limit=30, partition_max_time={"gpu": 60})
    route = eng.route(req)
    seen = []
    eng.compute = lambda r, partition, platform, deadline: seen.append((r, partition, platform)) or Outcome()
    eng.run_work(eng.work(route, time.monotonic() + 5.0))
    assert seen == [(req, route.name, route.platform)]
    assert list(vars(seen[0][0])) == list(vars(req))


def test_an_outcome_comes_back_with_its_job_and_the_spool_spelling_of_it():
    job = {"model": {"layers": 8, "hidden": 2048.5, "name": 'x"job":null\n\u00e9'}, "k": [1, 2]}
    out = Outcome(facts=PredictionFacts(1.5, 10, 20.25, "p", "b", (1.25, 2.0), 3.0),
                  warnings=["w\n1"], cacheable=True, job=job, compute_ms=1.5)
    back = Outcome.from_json(out.to_json())
    assert back == out and back.job_text == job_line_text(job)
    # a job the spool cannot hold (NaN) still comes back, without the text
    nan = Outcome.from_json(Outcome(job={"x": float("nan")}).to_json())
    assert math.isnan(nan.job["x"]) and nan.job_text == ""


def test_a_record_line_with_the_workers_job_text_is_the_line_without_it(tmp_path):
    lines = []

    class Spool(RecordSpool):
        def _write(self, data: bytes, records: int) -> bool:
            lines.append(data)
            return True
    job = {"model": {"layers": 8, "name": '"job":null'}, "run": {"iters": 2000}}
    spool = Spool(str(tmp_path / "r.sqlite"))
    for text in ('"job":null', 'a","job":null', "p\n"):
        rec = PredictionRecord(partition=text, platform=text, bundle=text, job=job,
                               iteration_seconds=1.25, iterations=3, total_seconds=4.0,
                               record_id="0123456789ab", created=1.5)
        spool.append(rec)
        spool.append(rec, job_line_text(job))
        assert lines[-1] == lines[-2]
        assert json.loads(lines[-1])["r"]["job"] == job
