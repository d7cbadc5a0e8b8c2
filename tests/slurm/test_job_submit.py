"""job_submit.lua + perf-predictd on a real Slurm: what users and admins see after sbatch."""
from __future__ import annotations

import os
import re
import socket
import threading
import time
from pathlib import Path

import pytest

from slurm_plugin.slurm_client import parse_slurm_time

from .conftest import script_text

RECORD = re.compile(r"^perfcast:v1 iter_s=[0-9.e+-]+ iters=\d+ total_min=[0-9.]+ "
                    r"platform=\S+ bundle=\S+")


def perfcast_lines(messages):
    return [m for m in messages if m.startswith("sbatch: perfcast:")]


def limit_of(info: dict):
    return parse_slurm_time(info["TimeLimit"])


@pytest.fixture
def megatron(cluster):
    def make(iters: int = 2000, name: str = "megatron.sh") -> Path:
        return cluster.write_script(name, script_text("megatron_gpt.sh", ITERS=str(iters)))
    return make


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_time_limit_filled_recorded_and_told(cluster, held_jobs, megatron, user):
    script = megatron(name=f"megatron-{user}.sh")
    # stderr apart (a log written through Python's logging is there): the record keeps the --error
    script.write_text(script.read_text().replace("\n", "\n#SBATCH --error=gpt-%j.err\n", 1))
    job, messages, _ = cluster.sbatch(script, user=None if user == "root" else user)
    held_jobs.append(job)
    info = cluster.show(job)
    expect = cluster.ask(script.read_text(), submit_uid=0 if user == "root" else 65534,
                         argv=[str(script)])
    assert expect["status"] == "ok", expect
    assert limit_of(info) == expect["time_limit"], info["TimeLimit"]
    assert limit_of(info) % 5 == 0 and limit_of(info) < 2880
    # --time-min from the point prediction, below the limit: backfill may start it sooner.
    assert expect["time_min"] is not None and expect["time_min"] < expect["time_limit"], expect
    assert parse_slurm_time(info["TimeMin"]) == expect["time_min"], info.get("TimeMin")
    assert f"min_min={expect['time_min']}" in info["AdminComment"]
    # ... and kept in the daemon's record store under the id the AdminComment carries.
    from slurm_plugin.records import RecordStore, parse_admin_comment
    rid = parse_admin_comment(info["AdminComment"])["rec"]
    store = RecordStore(str(cluster.base / "var" / "records.sqlite"), create=False)
    end = time.monotonic() + 30      # written by the daemon's writer thread, off the request path
    while (rec := store.get(rid)) is None and time.monotonic() < end:
        time.sleep(0.05)
    assert rec is not None and rec.partition == "gpu" and rec.time_min_minutes == expect["time_min"]
    assert rec.uid == (0 if user == "root" else 65534)
    # (sbatch makes it absolute; the %j stays for the harvest to expand, as scontrol does)
    assert rec.std_err == f"{cluster.jobs_dir}/gpt-%j.err" and info["StdErr"] == f"{cluster.jobs_dir}/gpt-{job}.err"
    assert RECORD.match(info["AdminComment"]), info["AdminComment"]
    assert "action=set" in info["AdminComment"]
    lines = perfcast_lines(messages)
    assert len(lines) == 1 and "time limit set to" in lines[0], messages
    assert info["UserId"].startswith(user)


def test_given_time_is_kept(cluster, held_jobs, megatron):
    script = megatron()
    rec = cluster.ask(script.read_text())["prediction"]["recommended_minutes"]
    job, messages, _ = cluster.sbatch(script, f"--time={rec}")
    held_jobs.append(job)
    info = cluster.show(job)
    assert limit_of(info) == rec
    assert "action=keep" in info["AdminComment"]
    (line,) = perfcast_lines(messages)
    assert "keeping --time" in line and "WARNING" not in line


def test_too_short_time_is_kept_but_warned(cluster, held_jobs, megatron):
    script = megatron()
    job, messages, _ = cluster.sbatch(script, "--time=1")
    held_jobs.append(job)
    assert limit_of(cluster.show(job)) == 1
    (line,) = perfcast_lines(messages)
    assert re.search(r"killed at about iteration \d+ of 2000", line), line
    assert "warn=short" in cluster.show(job)["AdminComment"]


def test_over_asking_is_warned(cluster, held_jobs, megatron):
    script = megatron()
    job, messages, _ = cluster.sbatch(script, "--time=2-00:00:00")
    held_jobs.append(job)
    assert limit_of(cluster.show(job)) == 2880
    (line,) = perfcast_lines(messages)
    assert "backfill" in line


def test_a_users_time_min_without_time_is_kept_and_the_limit_fills_above_it(cluster, held_jobs, megatron):
    # A short job: the fill alone would be well below 3 h, and a limit under --time-min is
    # refused by Slurm ("Invalid time-min specification"): the job must go in at 3 h.
    job, messages, _ = cluster.sbatch(megatron(iters=20, name="short-tmin.sh"), "--time-min=03:00:00")
    held_jobs.append(job)
    info = cluster.show(job)
    assert limit_of(info) == 180 and parse_slurm_time(info["TimeMin"]) == 180
    (line,) = perfcast_lines(messages)
    assert "time limit set to 03:00:00 (your --time-min" in line, line


def test_capped_at_partition_max_time(cluster, held_jobs, megatron):
    script = megatron(iters=2_000_000, name="long.sh")
    job, messages, _ = cluster.sbatch(script, "-p", "short")
    held_jobs.append(job)
    assert limit_of(cluster.show(job)) == 60
    (line,) = perfcast_lines(messages)
    assert re.search(r"only about \d+ of 2000000 iterations fit", line), line


def test_unmanaged_partition_untouched_and_silent(cluster, held_jobs, megatron):
    job, messages, _ = cluster.sbatch(megatron(), "-p", "cpu")
    held_jobs.append(job)
    info = cluster.show(job)
    assert info["TimeLimit"] == "UNLIMITED" and not info.get("AdminComment")
    assert not perfcast_lines(messages)


def test_non_training_job_goes_through_with_one_line(cluster, held_jobs):
    script = cluster.write_script("hostname.sh", "#!/bin/bash\n#SBATCH -N 1\nhostname\n")
    job, messages, _ = cluster.sbatch(script)
    held_jobs.append(job)
    info = cluster.show(job)
    assert info["TimeLimit"] == "2-00:00:00" and not info.get("AdminComment")
    (line,) = perfcast_lines(messages)
    assert "cannot predict" in line and "unchanged" in line


def test_garbage_script_fails_open(cluster, held_jobs):
    # sbatch itself refuses "\r\n" (DOS line breaks) before any plugin runs: keep \r out of the noise.
    noise = os.urandom(2000).replace(b"\0", b"x").replace(b"\r", b"x")
    junk = bytes(range(1, 256)) * 40 + b"\n$(( ( '\"\\\n" + noise
    path = cluster.jobs_dir / "garbage.sh"
    path.write_bytes(b"#!/bin/bash\n#SBATCH --gres=gpu:4\n" + junk + b"\nsrun python pretrain_gpt.py --num-layers\n")
    path.chmod(0o644)
    job, messages, _ = cluster.sbatch(path)
    held_jobs.append(job)
    assert cluster.show(job)["TimeLimit"] == "2-00:00:00"
    lines = perfcast_lines(messages)
    assert len(lines) == 1 and "unchanged" in lines[0], messages


def _swap_socket(cluster, replacement):
    """Put ``replacement`` (a function binding a path) where the daemon's socket is, then restore."""
    real = cluster.socket
    aside = real + ".aside"
    os.rename(real, aside)
    try:
        return replacement(real)
    finally:
        try:
            os.unlink(real)
        except FileNotFoundError:
            pass
        os.rename(aside, real)


def test_fail_open_daemon_stopped(cluster, held_jobs, megatron):
    script = megatron()

    def stale(path):   # what a crashed daemon leaves behind: a socket file nobody listens on
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.close()
        return cluster.sbatch(script)
    job, messages, wall = _swap_socket(cluster, stale)
    held_jobs.append(job)
    assert cluster.show(job)["TimeLimit"] == "2-00:00:00"
    (line,) = perfcast_lines(messages)
    assert "not reachable" in line and "unchanged" in line
    # and with no socket file at all
    job2, messages2, _ = _swap_socket(cluster, lambda path: cluster.sbatch(script))
    held_jobs.append(job2)
    assert "not reachable" in perfcast_lines(messages2)[0]


def test_fail_open_daemon_hung(cluster, held_jobs, megatron):
    script = megatron()
    accepted = []

    def hung(path):   # accepts, reads, never answers
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(path)
        srv.listen(8)
        stop = threading.Event()

        def loop():
            srv.settimeout(0.1)
            while not stop.is_set():
                try:
                    conn, _ = srv.accept()
                    accepted.append(conn)
                except OSError:
                    pass
        t = threading.Thread(target=loop, daemon=True)
        t.start()
        try:
            return cluster.sbatch(script)
        finally:
            stop.set()
            t.join()
            for c in accepted:
                c.close()
            srv.close()
    job, messages, wall = _swap_socket(cluster, hung)
    held_jobs.append(job)
    assert accepted, "the plugin never connected"
    assert cluster.show(job)["TimeLimit"] == "2-00:00:00"
    (line,) = perfcast_lines(messages)
    assert "did not answer within 300 ms" in line
    assert wall < 3.0


def test_untrusted_peer_refused_by_daemon(cluster):
    import subprocess
    import sys
    code = ("import json,socket; s=socket.socket(socket.AF_UNIX); s.connect(%r)\n"
            "try: s.sendall(json.dumps({'script': '#!/bin/bash', 'submit_uid': 0}).encode()+b'\\n')\n"
            "except OSError: pass\n"
            "print(s.recv(4096).decode())" % cluster.socket)
    # /usr/bin/python3: an interpreter that `nobody` can execute (pyenv's lives under /root)
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    out = subprocess.run(["runuser", "-u", "nobody", "--", py, "-c", code], capture_output=True,
                         text=True, timeout=30, cwd="/")
    assert "status=refused" in out.stdout, out.stderr
    log = (cluster.base / "log" / "predictd.log").read_text()
    assert "reason=peer-not-trusted" in log and "peer_uid=65534" in log


def test_unreadable_config_gets_no_prediction_and_never_leaks(cluster, held_jobs):
    marker = "SECRET-MARKER-%d" % os.getpid()
    secret_dir = cluster.jobs_dir / "private"
    secret_dir.mkdir(exist_ok=True)
    secret_dir.chmod(0o755)
    config = secret_dir / "neox.yml"
    config.write_text(script_text("neox_config.yml", MARKER=marker))
    config.chmod(0o600)   # root only
    script = cluster.write_script("neox.sh", script_text("neox.sh", CONFIG=str(config)))

    job, messages, _ = cluster.sbatch(script, user="nobody")
    held_jobs.append(job)
    info = cluster.show(job)
    assert info["TimeLimit"] == "2-00:00:00" and not info.get("AdminComment")
    (line,) = perfcast_lines(messages)
    assert "unchanged" in line

    # root may read it: then it is predicted (the same script, so only the rights differ)
    job2, messages2, _ = cluster.sbatch(script)
    held_jobs.append(job2)
    assert RECORD.match(cluster.show(job2)["AdminComment"] or ""), messages2

    texts = [" ".join(messages), " ".join(messages2), str(info), str(cluster.show(job2)),
             (cluster.base / "log" / "predictd.log").read_text(),
             (cluster.base / "log" / "slurmctld.log").read_text()]
    for text in texts:
        assert marker not in text


def test_sbatch_overhead_is_small(cluster, held_jobs, megatron):
    script = megatron()
    walls = []
    for _ in range(5):
        job, _, wall = cluster.sbatch(script)
        held_jobs.append(job)
        walls.append(wall)
    assert sorted(walls)[2] < 0.5, walls


def test_cli_filter_alternative(cluster, held_jobs, megatron):
    """sbatch with cli_filter.lua (etc-cli/slurm.conf) on the 'login node': the user's own sbatch
    reads the script and asks the daemon's user socket; the controller's job_submit.lua then sees
    --time as given and only confirms it."""
    script = megatron(name="megatron-cli.sh")
    rec = cluster.ask(script.read_text())["prediction"]["recommended_minutes"]
    job, messages, _ = cluster.sbatch(script, user="nobody",
                                      conf=str(cluster.base / "etc-cli" / "slurm.conf"))
    held_jobs.append(job)
    assert limit_of(cluster.show(job)) == rec
    lines = perfcast_lines(messages)
    assert "time limit set to" in lines[0], messages
    assert any("keeping --time" in l for l in lines[1:]), messages


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_cli_filter_prewarm_gives_the_cold_answer(cluster, held_jobs, megatron, user):
    """sbatch with cli_filter.lua warming the daemon up (etc-warm/slurm.conf, prewarm = true):
    job_submit.lua's request is answered from the warm-up, with the same limit, --time-min and
    AdminComment record as the same job submitted without it."""
    run_as = None if user == "root" else user
    cold_script = megatron(iters=1700, name=f"cold-{user}.sh")
    warm_script = megatron(iters=1700, name=f"warm-{user}.sh")
    cold, _, _ = cluster.sbatch(cold_script, user=run_as)
    held_jobs.append(cold)
    log = cluster.base / "log" / "predictd.log"
    seen = len(log.read_text(errors="replace").splitlines())
    job, messages, _ = cluster.sbatch(warm_script, user=run_as,
                                      conf=str(cluster.base / "etc-warm" / "slurm.conf"))
    held_jobs.append(job)
    a, b = cluster.show(cold), cluster.show(job)
    assert (a["TimeLimit"], a["TimeMin"]) == (b["TimeLimit"], b["TimeMin"])
    assert re.sub(r" rec=\w+", "", a["AdminComment"]) == re.sub(r" rec=\w+", "", b["AdminComment"])
    assert RECORD.match(b["AdminComment"]) and " rec=" in b["AdminComment"]
    lines = perfcast_lines(messages)
    assert len(lines) == 1 and "time limit set to" in lines[0], messages   # nothing from cli_filter
    new = log.read_text(errors="replace").splitlines()[seen:]
    uid = 0 if user == "root" else 65534
    assert any("event=warm " in l and f" peer_uid={uid} " in l for l in new), new
    (request,) = [l for l in new if "event=request " in l]
    assert " cached=1" in request or " joined=1" in request, request


@pytest.mark.parametrize("nodes", ["--nodes=4", "--nodes=2-4"])
def test_the_warm_up_meets_job_submit_under_a_node_count_or_range(cluster, held_jobs, megatron, nodes):
    """cli_filter.lua's typed --nodes and the max_nodes sbatch hands job_submit.lua describe the
    same job: the request is answered from the warm-up (one key for both)."""
    script = megatron(iters=1700, name=f"warm-range-{nodes[8:]}.sh")
    log = cluster.base / "log" / "predictd.log"
    seen = len(log.read_text(errors="replace").splitlines())
    job, messages, _ = cluster.sbatch(script, nodes, conf=str(cluster.base / "etc-warm" / "slurm.conf"))
    held_jobs.append(job)
    new = log.read_text(errors="replace").splitlines()[seen:]
    (request,) = [l for l in new if "event=request " in l]
    assert " cached=1" in request or " joined=1" in request, new


def test_large_script_round_trip(cluster, held_jobs):
    """A 1 MiB script (comments) still reaches the daemon whole and in time: Lua's escaping is one
    table-driven gsub."""
    body = script_text("megatron_gpt.sh", ITERS="2000")
    head, _, rest = body.partition("set -euo pipefail\n")
    filler = "".join(f"# padding line {i} with \"quotes\", \\backslashes\\ and\ttabs\n"
                     for i in range(18000))
    script = cluster.write_script("large.sh", head + filler + "set -euo pipefail\n" + rest)
    assert script.stat().st_size > 1_000_000
    job, messages, wall = cluster.sbatch(script)
    held_jobs.append(job)
    assert RECORD.match(cluster.show(job)["AdminComment"] or ""), messages
    assert wall < 2.0


def test_srun_without_batch_script_is_left_alone(cluster):
    import subprocess
    out = subprocess.run(["srun", "-p", "cpu", "-N1", "-t", "1", "true"], env=cluster.env(),
                         capture_output=True, text=True, timeout=60, cwd=str(cluster.jobs_dir))
    assert out.returncode == 0, out.stderr
    assert "perfcast" not in out.stderr


def test_up_is_idempotent(cluster):
    import subprocess
    from .conftest import DEV
    up = subprocess.run([str(DEV / "up.sh")], env=cluster.dev_env, capture_output=True, text=True,
                        timeout=60)
    assert up.returncode == 0, up.stderr
    perfcast_conf = str(cluster.dev_env.get("PERFCAST_DEV_BASE", "")) + "/etc/perfcast.toml"
    assert up.stdout.strip() == f"export SLURM_CONF={cluster.conf} PERFCAST_CONFIG={perfcast_conf}"
    assert "started" not in up.stderr and "starting" not in up.stderr, up.stderr


def test_megabyte_directive_line_does_not_hold_the_daemon(cluster, held_jobs, megatron):
    """A 1 MiB #SBATCH line (sbatch itself refuses a --comment that long, so it is sent the way
    job_submit.lua would send it) is answered, and the next real submission is predicted."""
    body = script_text("megatron_gpt.sh", ITERS="2000")
    head, _, rest = body.partition("\n")
    hostile = head + "\n#SBATCH --comment=" + "x" * (1 << 20) + "\n" + rest
    answer = cluster.ask(hostile, format="lines")
    assert answer["status"] in ("ok", "skip"), answer
    job, messages, _ = cluster.sbatch(megatron(name="after-hugeline.sh"))
    held_jobs.append(job)
    assert RECORD.match(cluster.show(job)["AdminComment"] or ""), messages


def test_daemon_runs_workers_and_its_pid_file_passes_the_install_check(cluster):
    from calibrate.install import daemon_argv, is_predictd
    pid = int((cluster.base / "run" / "predictd.pid").read_text().split()[0])
    argv = daemon_argv(pid)
    assert argv is not None and is_predictd(argv), argv
    children = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        children |= set(Path(f"/proc/{pid}/task/{task}/children").read_text().split())
    # forked workers (the same command line; a partition lookup may show up as scontrol)
    workers = [c for c in children if daemon_argv(int(c)) == argv]
    assert workers, "perf-predictd has no worker processes"


# --- what a user who made a typo reads after sbatch: perfcast's words and their own key, never
# another file's contents (one case per kind of launch error) ---------------------------------
_NEOX = ('{{\n  "pipe_parallel_size": 1,\n  "model_parallel_size": 1,\n  "num_layers": {layers},\n'
         '  "hidden_size": 768,\n  "num_attention_heads": 12,\n  "seq_length": 2048,\n'
         '  "{micro}": 4,\n  "train_iters": 5000,\n  "wandb_project": "{marker}"\n}}\n')
_NEMO = ("# {marker}\ntrainer:\n  devices: 4\n  num_nodes: 2\n  precision: bf16\n  max_steps: 1000\n"
         "model:\n  micro_batch_size: 1\n  global_batch_size: 64\n  tensor_model_parallel_size: 1\n"
         "  pipeline_model_parallel_size: 1\n  encoder_seq_length: 2048\n  num_layers: 12\n  hidden_size: 768\n"
         "  num_attention_heads: 12\n")
_TITAN = ('# {marker}\n[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\n'
          'seq_len = 2048\nsteps = 100\n[parallelism]\ntensor_paralel_degree = 2\n')
_DS = '{{\n  "train_micro_batch_size_per_gpu": 1,\n  "wall_clock_breakdown": "{marker}",\n  "zero_optimization": {{"stgae": 1}}\n}}\n'
_MEG = ("srun python pretrain_gpt.py --num-layers 12 --hidden-size 768 --num-attention-heads 12 "
        "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 "
        "--train-iters 1000 --bf16 {extra}\n")
_FOUNDRY = ("# {marker}\nmax_seq_len: 2048\nmodel:\n  name: mpt_causal_lm\n  d_model: 768\n  n_heads: 12\n"
            "  n_layer: 12\n  max_seq_len: 2048\n  vocab_size: 50368\n"
            "global_train_batch_size: 64\ndevice_train_microbatch_size: 1\nmax_duration: 1000ba\n"
            "precision: amp_bf16\n")
_HEAD = "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --gres=gpu:4\n#SBATCH --ntasks-per-node=4\n"
TYPO_CASES = {
    # kind: (config file name, config text, launch line, words the user must read, whether a value
    #        from the file is named and so redacted)
    "neox-misspelt-key": ("neox.yml", _NEOX.format(layers=12, micro="train_micro_batch_sise_per_gpu", marker="{m}"),
                          "python ./deepy.py train.py {cfg}\n",
                          ["'train_micro_batch_sise_per_gpu' is not a GPT-NeoX key",
                           "did you mean 'train_micro_batch_size_per_gpu'?"], False),
    "neox-not-an-integer": ("neox.yml", _NEOX.format(layers='"{m}"', micro="train_micro_batch_size_per_gpu",
                                                     marker="x"),
                            "python ./deepy.py train.py {cfg}\n", ["model.layers unknown: num_layers is '<file content>'"],
                            True),
    "megatron-flag": ("unused.txt", "{m}\n", _MEG.format(extra="--tensor-model-paralel-size 2"),
                      ["--tensor-model-paralel-size is not a Megatron argument",
                       "did you mean --tensor-model-parallel-size?", "Megatron will refuse this flag at start"],
                      False),
    "nemo-override": ("conf/gpt.yaml", _NEMO.format(marker="{m}"),
                      "srun python megatron_gpt_pretraining.py --config-path={dir}/conf --config-name=gpt "
                      "trainer.max_step=75000\n",
                      ["trainer.max_step: not in gpt.yaml", "Hydra refuses", "did you mean trainer.max_steps?"],
                      False),
    "torchtitan-key": ("titan.toml", _TITAN.format(marker="{m}"),
                       "srun torchrun --nnodes 2 --nproc_per_node 4 -m torchtitan.train --job.config_file {cfg}\n",
                       ["[parallelism] tensor_paralel_degree is not a TorchTitan config key",
                        "did you mean [parallelism] tensor_parallel_degree?"], False),
    "deepspeed-key": ("ds.json", _DS.format(marker="{m}"),
                      _MEG.format(extra="--deepspeed --deepspeed_config {cfg}"),
                      ["'stgae' is not a DeepSpeed zero_optimization key", "did you mean 'stage'?"], False),
    "llm-foundry-key": ("mpt.yaml", _FOUNDRY,
                        "srun composer --world_size 8 scripts/train/train.py {cfg}\n",
                        ["model.n_layer is not an llm-foundry model key", "did you mean model.n_layers?"], False),
}


@pytest.mark.parametrize("kind", sorted(TYPO_CASES))
def test_launch_error_reads_in_perfcast_words_with_the_users_key(cluster, held_jobs, kind):
    name, config, launch, expected, redacted = TYPO_CASES[kind]
    marker = f"SECRET{os.getpid()}x{kind.replace('-', '')}"
    base = cluster.jobs_dir / f"typo-{kind}"
    cfg = base / name
    cfg.parent.mkdir(parents=True, exist_ok=True)
    for d in (base, cfg.parent):
        d.chmod(0o755)
    cfg.write_text(config.replace("{m}", marker))
    cfg.chmod(0o644)
    script = cluster.write_script(f"typo-{kind}.sh", _HEAD + launch.format(cfg=cfg, dir=base))
    job, messages, _ = cluster.sbatch(script, user="nobody")
    held_jobs.append(job)
    assert cluster.show(job)["TimeLimit"] == "2-00:00:00"           # nothing changed
    (line,) = perfcast_lines(messages)
    assert "cannot predict" in line and "unchanged" in line, line
    for words in expected:
        assert words in line, (words, line)
    assert marker not in line and marker not in " ".join(messages)
    from slurm_plugin.daemon.engine import REDACTED
    assert (REDACTED in line) == redacted, line
    assert f"{name.split('/')[-1]}:" in line or kind == "megatron-flag" or "job.sbatch" in line or \
        f"typo-{kind}.sh:" in line, line
