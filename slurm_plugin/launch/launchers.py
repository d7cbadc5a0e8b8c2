"""Recognising the training launch inside an evaluated command line.

A launch line is a stack of wrappers (``srun``, ``mpirun``, ``singularity exec``, ``env``,
``numactl``, ``bash -c``…) around a launcher (``torchrun``, ``python -m torch.distributed.run``,
``deepspeed``, GPT-NeoX ``deepy.py``, or none) around a training script (``pretrain_gpt.py``,
``train.py``…). :func:`classify` peels the wrappers and reads the launcher options it needs to
find the script; the framework modules read the script's own arguments. The framework hint comes
from the script and its arguments: ``deepy.py`` (neox), ``-m torchtitan.train`` / ``--job.config_file``
(torchtitan), Composer's ``composer`` launcher or ``train.py X.yaml`` (llm-foundry), NeMo's
``megatron_gpt_pretraining.py`` or Hydra ``--config-path`` / ``key=value``
arguments (nemo), ``nemo llm …`` (nemo2, refused), Megatron flags or ``pretrain_*.py`` (megatron),
``--deepspeed_config`` (deepspeed).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

from .limits import CannotPredict
from .llmfoundry import is_llmfoundry
from .nemo import NEMO_SCRIPTS
from .neox_keys import suggest
from .torchtitan import is_torchtitan
from .sbatch import split_options
from .values import MARK_OPEN, Tok

_PYTHON = re.compile(r"python[0-9.]*|pypy[0-9.]*")
_HYDRA_OVERRIDE = re.compile(r"[+~]{0,2}(trainer|model|exp_manager)\.[A-Za-z_.]+=")

MEGATRON_FLAGS = {
    "--num-layers", "--hidden-size", "--num-attention-heads", "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size", "--micro-batch-size", "--global-batch-size", "--seq-length",
}

_TORCHRUN_FLAGS = {"standalone", "no_python", "no-python", "module", "m", "run_path", "run-path", "help",
                   "use_env", "use-env", "virtual_local_rank", "virtual-local-rank"}
_DS_OPTIONS = [  # deepspeed/launcher/runner.py (argparse allow_abbrev=True: unique prefixes work)
    ("hostfile", True), ("include", True), ("exclude", True), ("num_nodes", True), ("num_gpus", True),
    ("num_accelerators", True), ("min_elastic_nodes", True), ("max_elastic_nodes", True),
    ("master_port", True), ("master_addr", True), ("node_rank", True), ("launcher", True),
    ("launcher_args", True), ("module", False), ("no_python", False), ("no_local_rank", False),
    ("no_ssh", False), ("no_ssh_check", False), ("force_multi", False), ("save_pid", False),
    ("enable_each_rank_log", True), ("autotuning", True), ("elastic_training", False),
    ("bind_cores_to_rank", False), ("bind_core_list", True), ("ssh_port", True), ("comment", True),
    ("account", True), ("venv_script", True),
]
_DS_SHORT = {"H": "hostfile", "i": "include", "e": "exclude"}
_MPI_VALUE = {"-np", "-n", "-c", "-N", "--npernode", "-npernode", "-ppn", "--map-by", "-map-by", "--bind-to",
              "-bind-to", "-x", "-H", "--host", "-host", "--hostfile", "-hostfile", "-f", "--rankfile", "-wdir",
              "--wdir", "-machinefile", "--machinefile", "--rank-by", "-rank-by", "--cpus-per-proc",
              "--output-filename", "--tag-output-noop"}
_MPI_TWO = {"--mca", "-mca", "-genv", "-env", "--gmca", "-gmca"}
_CONTAINER_VALUE = {"-B", "--bind", "--env", "--env-file", "-H", "--home", "-W", "--workdir", "--pwd",
                    "--overlay", "-o", "-S", "--scratch", "--security", "--network", "--hostname", "--app",
                    "--mount", "--network-args", "--dns", "--apply-cgroups", "--nv-ccli"}
_PYXIS_FLAGS = {"--container-mount-home", "--no-container-mount-home", "--container-remap-root",
                "--no-container-remap-root", "--container-entrypoint", "--no-container-entrypoint",
                "--container-writable", "--container-readonly", "--container-entrypoint-log"}
_SKIP_WRAPPERS = {"time", "nohup", "exec", "stdbuf", "nice", "ionice", "numactl", "taskset", "timeout",
                  "chrt", "unbuffer", "setsid", "nsys", "ncu", "valgrind", "strace", "likwid-pin",
                  "apptainer-noop", "srun.sh"}


@dataclass
class Wrapper:
    kind: str                       # srun | mpirun | container | env | bash
    opts: list                      # [(name, value text or None)]
    where: str = ""


@dataclass
class Classified:
    kind: str = "none"              # none | launch | bash-c | bash-file | bash-stdin | sbatch | eval-args
    wrappers: list = field(default_factory=list)
    launcher: str = "none"          # none | torchrun | deepspeed | mpirun | deepy | composer
    launcher_opts: dict = field(default_factory=dict)   # name -> Tok or True
    script: Optional[Tok] = None    # the training script (or bash -c string / bash file)
    args: list = field(default_factory=list)            # Toks after the script
    framework_hint: str = "unknown"  # neox | megatron | deepspeed | nemo | nemo2 | torchtitan | llm-foundry | unknown
    python_module: Optional[str] = None
    unknown_words: list = field(default_factory=list)   # unknown command words we skipped
    dollar0: Optional[Tok] = None   # bash -c STRING NAME ...: the word that becomes $0


def _base(text: str) -> str:
    return text[text.rfind("/") + 1:]     # posixpath.basename, without its call overhead


def _is_python(base: str) -> bool:
    return bool(_PYTHON.fullmatch(base))


def classify(toks: list, where: str = "") -> Classified:
    c = Classified()
    i, n = 0, len(toks)
    while i < n:
        t = toks[i].text
        if MARK_OPEN in t and not t.endswith(".py"):
            c.unknown_words.append(toks[i])
            i += 1
            continue
        b = _base(t)
        if b == "srun":
            # Pyxis/enroot's flags without a value are unknown to the srun option table: taken out
            # first so that they do not swallow the command (`--no-container-mount-home bash -c …`).
            rest = toks[i + 1:]
            texts = [x.text for x in rest]
            if _PYXIS_FLAGS.isdisjoint(texts):
                keep: Sequence[int] = range(len(rest))
            else:
                keep = [k for k, x in enumerate(texts) if x not in _PYXIS_FLAGS]
                texts = [texts[k] for k in keep]
            opts, j = split_options(texts, stop_at_command=True)
            c.wrappers.append(Wrapper("srun", [(o[0], o[1]) for o in opts], where))
            i += 1 + (keep[j] if j < len(keep) else len(rest))
            continue
        if b in ("mpirun", "mpiexec", "orterun", "aprun"):
            j = i + 1
            opts = []
            while j < n and toks[j].text.startswith("-"):
                name = toks[j].text
                if "=" in name:
                    k, _, v = name.partition("=")
                    opts.append((k.lstrip("-"), v))
                    j += 1
                elif name in _MPI_TWO:
                    j += 3
                elif name in _MPI_VALUE and j + 1 < n:
                    opts.append((name.lstrip("-"), toks[j + 1].text))
                    j += 2
                else:
                    opts.append((name.lstrip("-"), None))
                    j += 1
            c.wrappers.append(Wrapper("mpirun", opts, where))
            i = j
            continue
        if b in ("singularity", "apptainer", "docker", "podman", "enroot", "shifter", "charliecloud",
                 "ch-run", "podman-hpc"):
            j = i + 1
            if j < n and toks[j].text in ("exec", "run", "start", "shell"):
                j += 1
            while j < n and toks[j].text.startswith("-"):
                name = toks[j].text
                j += 2 if ("=" not in name and name in _CONTAINER_VALUE) else 1
            c.wrappers.append(Wrapper("container", [("image", toks[j].text if j < n else None)], where))
            i = j + 1     # skip the image
            continue
        if b == "env":
            j = i + 1
            while j < n and (toks[j].text.startswith("-") or re.match(r"[A-Za-z_][A-Za-z0-9_]*=", toks[j].text)):
                j += 2 if toks[j].text in ("-u", "--unset", "-C", "--chdir") else 1
            i = j
            continue
        if b in _SKIP_WRAPPERS:
            j = i + 1
            if b == "nsys" and j < n and toks[j].text == "profile":
                j += 1
            if b in ("taskset", "timeout", "chrt") and j < n and not toks[j].text.startswith("-"):
                j += 1
            while j < n and toks[j].text.startswith("-"):
                j += 1
                if b == "nice" and toks[j - 1].text == "-n":
                    j += 1
            if b == "taskset" and j < n and re.fullmatch(r"0x[0-9a-fA-F]+|[0-9,\-]+", toks[j].text):
                j += 1
            i = j
            continue
        if b in ("bash", "sh", "zsh", "dash", "ksh"):
            j = i + 1
            while j < n and toks[j].text.startswith("-") and toks[j].text not in ("-c", "--"):
                j += 1
            if j < n and toks[j].text == "-c":
                if j + 1 >= n:
                    return c
                c.kind, c.script = "bash-c", toks[j + 1]
                c.args = toks[j + 3:] if j + 2 < n else []
                c.dollar0 = toks[j + 2] if j + 2 < n else None
                return c
            if j < n and toks[j].text == "--":
                j += 1
            if j >= n:
                c.kind = "bash-stdin"
                return c
            c.kind, c.script, c.args = "bash-file", toks[j], toks[j + 1:]
            return c
        if b.endswith(".sh") and "/" in t and b != ".sh":
            # `srun ./train.sh`: a shell script run by its path is read as `bash ./train.sh` (its
            # #! line is not read; a .sh script is a shell's)
            c.kind, c.script, c.args = "bash-file", toks[i], toks[i + 1:]
            return c
        if b == "sbatch":
            c.kind = "sbatch"
            return c
        if b == "eval":
            c.kind, c.args = "eval-args", toks[i + 1:]
            return c
        if b == "nemo" and i + 1 < n and toks[i + 1].text == "llm":
            # NeMo 2.0's CLI (`nemo llm pretrain --factory llama3_8b`): a Python recipe, refused later
            c.kind, c.script, c.args, c.framework_hint = "launch", toks[i], toks[i + 1:], "nemo2"
            return c
        if b == "deepspeed":
            return _deepspeed(c, toks, i + 1)
        if b == "torchrun":
            return _torchrun(c, toks, i + 1)
        if b == "composer":
            return _composer(c, toks, i + 1)
        if _is_python(b):
            j = i + 1
            while j < n and toks[j].text.startswith("-") and toks[j].text not in ("-m", "-c", "-"):
                j += 2 if toks[j].text in ("-X", "-W") else 1
            if j >= n:
                return c
            if toks[j].text == "-c":
                return c
            if toks[j].text == "-m" and j + 1 < n:
                mod = toks[j + 1].text
                if mod in ("torch.distributed.run", "torch.distributed.launch"):
                    return _torchrun(c, toks, j + 2)
                if mod in ("deepspeed.launcher.runner", "deepspeed"):
                    return _deepspeed(c, toks, j + 2)
                if mod in ("composer", "composer.cli", "composer.cli.launcher"):
                    return _composer(c, toks, j + 2)
                c.python_module = mod
                return _entry(c, toks[j + 1], toks[j + 2:])
            return _entry(c, toks[j], toks[j + 1:])
        if t.endswith(".py"):
            return _entry(c, toks[i], toks[i + 1:])
        # An unknown program (`./launch.sh`, `accelerate`): the training command may follow it.
        i += 1
    return c


def _entry(c: Classified, script: Tok, args: list) -> Classified:
    b = _base(script.text)
    flags = {a.text.split("=", 1)[0] for a in args if a.text.startswith("--")}
    if b == "deepy.py":
        c.kind, c.launcher, c.script, c.args, c.framework_hint = "launch", "deepy", script, args, "neox"
        return c
    if is_torchtitan(c.python_module, flags):
        hint = "torchtitan"
    elif is_llmfoundry(c.launcher, c.python_module, script, args):
        hint = "llm-foundry"     # before NeMo: its overrides (model.n_layers=4) look like Hydra's
    elif b in NEMO_SCRIPTS or (not flags & MEGATRON_FLAGS and _hydra(args)):
        hint = "nemo"        # NeMo 1.x: Hydra config + key=value overrides
    elif flags & MEGATRON_FLAGS or b.startswith("pretrain_") or "megatron" in (c.python_module or ""):
        hint = "megatron"
    elif flags & {"--deepspeed_config", "--deepspeed-config", "--deepspeed", "--deepscale_config"}:
        hint = "deepspeed"
    elif c.launcher in ("torchrun", "deepspeed") or any(w.kind in ("srun", "mpirun") for w in c.wrappers):
        hint = "unknown"     # something distributed, but not a framework we read
    else:
        return Classified(kind="none", wrappers=c.wrappers)
    c.kind, c.script, c.args, c.framework_hint = "launch", script, args, hint
    return c


def _hydra(args: list) -> bool:
    """Hydra's config options or ``key=value`` overrides among a script's arguments (NeMo 1.x)."""
    return any(a.text.startswith(("--config-path", "--config-name")) for a in args) or \
        any(_HYDRA_OVERRIDE.match(a.text) for a in args)


def _option(c: Classified, toks: list, i: int, key: str, flags: set) -> int:
    """Store the launcher option at ``toks[i]`` under ``key`` (``--k=v``, ``--k v``, or a flag of
    ``flags`` that takes no value) and return the index after it."""
    t = toks[i].text
    name, eq, val = t.lstrip("-").partition("=")
    if eq:
        c.launcher_opts[key] = Tok(val, [(val, toks[i].origin_at(len(t) - len(val)))])
        return i + 1
    if name in flags:
        c.launcher_opts[key] = True
        return i + 1
    if i + 1 < len(toks):
        c.launcher_opts[key] = toks[i + 1]
        return i + 2
    return i + 1


# torchrun's options (torch/distributed/run.py get_args_parser, torch 2.13: each in both spellings;
# tests/launch/test_typos_more.py checks the list against the installed torch), and
# torch.distributed.launch's --use-env.  Its argparse takes an unambiguous prefix of a long option.
_TORCHRUN_LONG = frozenset(spelling for o in """
nnodes nproc-per-node rdzv-backend rdzv-endpoint rdzv-id rdzv-conf standalone max-restarts monitor-interval
start-method event-log-handler role module no-python run-path log-dir redirects tee local-ranks-filter node-rank
master-addr master-port local-addr logs-specs numa-binding signals-to-handle use-env help virtual-local-rank
duplicate-stdout-filters duplicate-stderr-filters shutdown-timeout
""".split() for spelling in (o, o.replace("-", "_")))


def _torchrun_option(t: str, where: str) -> str:
    """The option name ``t`` (``--nnode``, ``--nproc_per_node=8``) stands for, as torchrun's argparse
    resolves it; an option it does not know stops the prediction, as it stops torchrun."""
    if t.startswith("--"):
        name = t[2:].partition("=")[0]
        if name in _TORCHRUN_LONG or MARK_OPEN in name:
            return name
        hits = {o.replace("_", "-") for o in _TORCHRUN_LONG if o.startswith(name)} if name else set()
        if len(hits) == 1:
            return hits.pop()
        if hits:
            why = f"is ambiguous (--{', --'.join(sorted(hits))})"
        else:
            guess = suggest(name.replace("_", "-"), frozenset(o for o in _TORCHRUN_LONG if "_" not in o))
            why = "is not a torchrun option" + (f"; did you mean --{guess}?" if guess else "")
        raise CannotPredict(f"torchrun --{name} {why} (torchrun's argparse refuses it and the job stops at start)",
                            where)
    return t[1:].partition("=")[0]


def _torchrun(c: Classified, toks: list, i: int) -> Classified:
    c.launcher = "torchrun"
    n = len(toks)
    while i < n:
        t = toks[i].text
        if t == "--":
            i += 1
            break
        if not t.startswith("-"):
            break
        name = _torchrun_option(t, toks[i].origin_at(0))
        if name in _TORCHRUN_FLAGS and "=" not in t:
            c.launcher_opts[name.replace("-", "_")] = True
            i += 1
        else:
            i = _option(c, toks, i, name.replace("-", "_"), _TORCHRUN_FLAGS)
        if name in ("m", "module") and "=" not in t and i < n:
            c.python_module = toks[i].text
            return _entry(c, toks[i], toks[i + 1:])
    if i >= n:
        return c
    return _entry(c, toks[i], toks[i + 1:])


# Composer's launcher (composer/cli/launcher.py): the options that take no value
_COMPOSER_FLAGS = {"m", "module_mode", "c", "command_mode", "v", "verbose"}


def _composer(c: Classified, toks: list, i: int) -> Classified:
    """``composer [-n N] [--world_size W] [--node_rank R] … train.py ARGS``: -n is read as nproc."""
    c.launcher = "composer"
    n = len(toks)
    while i < n:
        t = toks[i].text
        if not t.startswith("-") or t == "-":
            break
        name = t.lstrip("-").partition("=")[0]
        i = _option(c, toks, i, {"n": "nproc"}.get(name, name.replace("-", "_")), _COMPOSER_FLAGS)
    if i >= n:
        return c
    if c.launcher_opts.get("m") is True or c.launcher_opts.get("module_mode") is True:
        c.python_module = toks[i].text
    return _entry(c, toks[i], toks[i + 1:])


def _ds_name(name: str) -> Optional[tuple]:
    exact = [o for o in _DS_OPTIONS if o[0] == name]
    if exact:
        return exact[0]
    pref = [o for o in _DS_OPTIONS if o[0].startswith(name)]
    return pref[0] if len(pref) == 1 else None


def _deepspeed(c: Classified, toks: list, i: int) -> Classified:
    c.launcher = "deepspeed"
    n = len(toks)
    while i < n:
        t = toks[i].text
        if not t.startswith("-") or t == "-":
            break
        if t.startswith("--"):
            name, eq, val = t[2:].partition("=")
            opt = _ds_name(name.replace("-", "_"))
        else:
            name, eq, val = t[1:2], "", t[2:]
            opt = (_DS_SHORT[name], True) if name in _DS_SHORT else None
            if val:
                eq = "="
        if opt is None:
            i += 1
            continue
        key, takes = opt
        if key == "num_accelerators":
            key = "num_gpus"
        if not takes:
            c.launcher_opts[key] = True
            i += 1
        elif eq:
            c.launcher_opts[key] = Tok(val, [(val, toks[i].origin_at(len(t) - len(val)))])
            i += 1
        elif i + 1 < n:
            c.launcher_opts[key] = toks[i + 1]
            i += 2
        else:
            i += 1
    if i >= n:
        return c
    return _entry(c, toks[i], toks[i + 1:])
