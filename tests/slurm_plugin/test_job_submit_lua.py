"""What job_submit.lua sends for the QOS / association MaxWall, run by Lua 5.1 with stand-ins for
slurmctld's ``slurm`` table and lua-socket (the real thing runs in tests/slurm)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import slurm_plugin

LUA = shutil.which("lua5.1")
SCRIPT = Path(slurm_plugin.__file__).parent / "lua" / "job_submit.lua"

DRIVER = r"""
local sent = {}
package.preload["socket"] = function() return { gettime = os.time } end
package.preload["socket.unix"] = function()
    local conn = {}
    function conn:settimeout(t) end
    function conn:connect(path) return 1 end
    function conn:send(data, i) sent[#sent + 1] = string.sub(data, i or 1); return #data end
    local answered = false
    function conn:receive(n)
        if answered then return nil, "closed", "" end
        answered = true
        return "status=ok\ntime_limit=12\nmessage=perfcast: capped\n"
    end
    function conn:close() end
    return { stream = function() return conn end }
end
local said = {}
slurm = { SUCCESS = 0, NO_VAL = 4294967294,
          log_info = function(...) end, log_error = function(...) end,
          log_user = function(fmt, ...) said[#said + 1] = string.format(fmt, ...) end }
dofile(SCRIPT_PATH)
local job_desc = JOB
local part_list = {
    watch = { name = "watch", max_time = 60, flag_default = 0, qos = "pq" },
    gpu = { name = "gpu", max_time = 2880, flag_default = 1 },
}
assert(slurm_job_submit(job_desc, part_list, 0) == 0)
io.write(table.concat(sent))   -- (ends with its own newline)
io.write(tostring(job_desc.time_limit), "\n")
io.write(table.concat(said, "|"), "\n")
"""


def run_lua(job: str) -> tuple[dict, str, str]:
    code = DRIVER.replace("SCRIPT_PATH", json.dumps(str(SCRIPT))).replace("JOB", job)
    out = subprocess.run([LUA, "-"], input=code, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    payload, limit, said = out.stdout.rstrip("\n").split("\n")[-3:]
    return json.loads(payload), limit, said


BASE = ('{ script = "#!/bin/bash\\nsrun x\\n", work_dir = "/tmp", user_id = 1000, group_id = 1000, '
        'time_limit = 4294967294, partition = "watch"')


@pytest.mark.skipif(LUA is None, reason="lua5.1 not installed")
def test_sends_qos_account_and_the_partitions_qos():
    req, limit, said = run_lua(BASE + ', qos = "qa10", account = "proj", default_qos = "dq", '
                                      'default_account = "da" }')
    assert req["qos"] == "qa10" and req["account"] == "proj"
    # slurmctld's defaults are only asked for (and sent) when the job names none
    assert "default_qos" not in req and "default_account" not in req
    assert req["partitions"]["watch"] == {"max_time": 60, "default": False, "qos": "pq"}
    assert req["partitions"]["gpu"] == {"max_time": 2880, "default": True}
    assert limit == "12" and said == "perfcast: capped"


@pytest.mark.skipif(LUA is None, reason="lua5.1 not installed")
def test_sends_slurmctlds_defaults_without_qos_or_account():
    req, _, _ = run_lua(BASE + ', default_qos = "dq", default_account = "da" }')
    assert "qos" not in req and "account" not in req
    assert req["default_qos"] == "dq" and req["default_account"] == "da"
    req, _, _ = run_lua(BASE + " }")          # an older Slurm, or no accounting: nothing to send
    assert not {"qos", "account", "default_qos", "default_account"} & set(req)


@pytest.mark.skipif(LUA is None, reason="lua5.1 not installed")
def test_sends_output_and_error_as_submitted():
    # The record keeps both: sacct (22.05) names neither file, and a log written through Python's
    # logging is in the --error one.
    req, _, _ = run_lua(BASE + ', std_out = "train-%j.out", std_err = "logs/train-%x-%j.err" }')
    assert req["std_out"] == "train-%j.out" and req["std_err"] == "logs/train-%x-%j.err"
    req, _, _ = run_lua(BASE + " }")          # neither given: Slurm's defaults, nothing sent
    assert "std_out" not in req and "std_err" not in req
