"""parse_script: batch script (+ the configs it names) -> ParsedScript. Never executes, never raises."""
from __future__ import annotations

import dataclasses
import logging
import posixpath
import re
from typing import Callable, Mapping, Optional

from predictor.errors import JobError
from predictor.job import TrainingJob

from . import deepspeed as ds
from . import llmfoundry, megatron, moe, nemo, neox, torchtitan
from .configs import Config, load_config
from .derive import World, build
from .facts import Facts
from .files import decode_text, default_read_file, join_path, os_reason
from .launchers import Classified
from .limits import MAX_CONFIG_BYTES, MAX_SOURCED_FILES, Budget, CannotPredict
from .result import ParsedScript, SlurmRequest
from .sbatch import GPN_EXACT, array_first_index, derive_request, merge_request, read_directives, slurm_env
from .shell import Launch, Shell
from .slips import continuation_slips
from .values import MARK_OPEN, Tok, Unknowns, sanitize_text

log = logging.getLogger(__name__)
# The request field each SLURM_* variable of sbatch.slurm_env comes from (its provenance)
_SLURM_ENV_ORIGIN = {
    "SLURM_NNODES": "request.nodes", "SLURM_JOB_NUM_NODES": "request.nodes",
    "SLURM_NTASKS": "request.ntasks", "SLURM_NPROCS": "request.ntasks",
    "SLURM_NTASKS_PER_NODE": "request.ntasks_per_node", "SLURM_GPUS_ON_NODE": "request.gpus_per_node",
    "SLURM_GPUS_PER_NODE": "request.gpus_per_node", "SLURM_CPUS_PER_TASK": "request.cpus_per_task",
    "SLURM_ARRAY_TASK_ID": "request.array"}
_RUN_TIME_ONLY = tuple((k, f"{k} is only known when the job runs") for k in (
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURMD_NODENAME",
    "SLURM_CLUSTER_NAME", "SLURM_JOB_USER", "SLURM_SUBMIT_HOST", "SLURM_TASK_PID"))


def parse_script(path: Optional[str], text: Optional[str] = None, *, request: Optional[SlurmRequest] = None,
                 read_file: Optional[Callable[[str], bytes]] = None, env: Optional[Mapping[str, str]] = None,
                 default_gpus_per_node: Optional[int] = None, work_dir: Optional[str] = None,
                 deadline_s: Optional[float] = None,
                 _depth: int = 0, _budget: Optional[Budget] = None) -> ParsedScript:
    """Read a batch script and the configs it names into a TrainingJob (see the package docstring).

    ``deadline_s`` replaces the last-resort wall-clock bound (``limits.DEFAULT_DEADLINE_S``); the
    counted bounds (commands, loop iterations, sizes) hold whatever it is.
    """
    reader = read_file or default_read_file
    label = path or "<script>"
    result = ParsedScript(job=None, job_dict={}, request=request or SlurmRequest())
    budget = _budget or (Budget(deadline_s) if deadline_s is not None else Budget())
    slips: list[str] = []
    unset: list[tuple[str, str]] = []
    try:
        _parse(result, path, text, label, request, reader, env, default_gpus_per_node, work_dir, budget, _depth,
               slips, unset)
    except CannotPredict as exc:
        result.job = None
        result.error = exc.line()
        if unset:
            # The script ran and read unset variables as empty: likely why the launch went wrong;
            # said in the error, not also as a warning.
            warning, clause = unset[0]
            result.error = f"{result.error} {clause}"
            result.warnings = [w for w in result.warnings if w != warning]
    except RecursionError:
        result.job = None
        result.error = f"cannot predict: the script is nested too deeply ({label})"
    except MemoryError:
        result.job = None
        result.error = f"cannot predict: the script needs too much memory to evaluate ({label})"
    except ValueError as exc:
        # Python refuses int() of more than 4,300 digits wherever a reader converts a number: the
        # user's input, not a parser bug.
        if "integer string conversion" not in str(exc):
            log.exception("launch parser bug on %s", label)
            result.error = f"cannot predict: internal parser error {type(exc).__name__} ({label})"
        else:
            result.error = f"cannot predict: a number in the script or its configs has too many digits ({label})"
        result.job = None
    except Exception as exc:  # noqa: BLE001 - a daemon must answer, not crash; the bug is logged
        log.exception("launch parser bug on %s", label)
        result.job = None
        result.error = f"cannot predict: internal parser error {type(exc).__name__} ({label})"
    if slips and result.error:
        result.error = f"{result.error}; note: {slips[0]}"
    if result.error and len(result.error) > 400:
        result.error = result.error[:397] + "..."
    if result.error:
        result.error = result.error.replace("\n", " ")
    return result


def _parse(res: ParsedScript, path, text, label, request, reader, env, default_gpn, work_dir, budget, depth,
           slips: list, unset: list) -> None:
    if text is None:
        if path is None:
            raise CannotPredict("no script given")
        try:
            raw = reader(path)
        except (OSError, ValueError) as exc:
            raise CannotPredict(f"cannot read {path}: {os_reason(exc)}", path) from None
        text = decode_text(raw, label)
    elif len(text) > (4 << 20):
        raise CannotPredict(f"{label} is larger than 4 MiB", f"{label}:1")
    if "\x00" in text:
        raise CannotPredict(f"{label} is not a text file (NUL byte)", f"{label}:{text[:text.index(chr(0))].count(chr(10)) + 1}")
    if depth == 0 and "\r\n" in text:
        # sbatch refuses such a script ("Batch script contains DOS line breaks"); bash would read
        # each \r as part of a word.
        line = text[:text.index("\r\n")].count("\n") + 1
        raise CannotPredict(f"{label} has DOS line breaks (\\r\\n), which sbatch refuses: convert it "
                            "with dos2unix or sed -i 's/\\r$//'", f"{label}:{line}")
    text = sanitize_text(text)
    if depth == 0:
        # Flags after such a line are lost to the launch: said whatever else goes wrong or right.
        slips.extend(continuation_slips(text, label))
        res.warnings.extend(slips)
    # ------------------------------------------------------------------ request
    directives = read_directives(text, label, budget)
    req, prov = merge_request(directives, request)
    warnings = res.warnings
    warnings.extend(directives.warnings)
    derive_request(req, directives, prov, default_gpn, warnings)
    res.request = req
    res.provenance.update({k: v for k, v in prov.items() if not k.endswith((".invalid", ".exact"))})
    if "request.nodes.invalid" in prov:
        res.unresolved.append("request.nodes")
    if work_dir is None:
        work_dir = directives.chdir if directives.chdir and posixpath.isabs(directives.chdir) else \
            (posixpath.dirname(posixpath.abspath(path)) if path else None)
    elif directives.chdir:
        work_dir = join_path(work_dir, directives.chdir)
    array_first = array_first_index(req.array)
    if req.array and array_first is not None and not re.fullmatch(r"\s*\d+\s*", req.array):
        warnings.append(f"job array {req.array}: predicting array task {array_first} ({prov.get('request.array', label)})")
    # ------------------------------------------------------------------ environment
    u = Unknowns()
    shell_env: dict = {}
    for k, v in (env or {}).items():
        if isinstance(k, str) and isinstance(v, str) and k.isascii() and k.isidentifier():   # a shell name
            shell_env[k] = (sanitize_text(v)[:65536], "environment")
    for k, v in slurm_env(req, work_dir, array_first).items():
        shell_env[k] = (v, prov.get(_SLURM_ENV_ORIGIN.get(k, ""), "Slurm"))
    for k, reason in _RUN_TIME_ONLY:
        if k not in shell_env:
            shell_env[k] = (u.new(reason, nonempty=True), "Slurm")
    if work_dir:
        shell_env["PWD"] = (work_dir, "submit directory")   # bash sets PWD itself
    if "SLURM_NNODES" not in shell_env:
        reason = "the number of nodes is not known from the request"
        shell_env["SLURM_NNODES"] = shell_env["SLURM_JOB_NUM_NODES"] = (u.new(reason, True), "Slurm")
    sh = Shell(budget=budget, unknowns=u, read_file=reader, env=shell_env, cwd=work_dir, warnings=warnings)
    sh.run(text, label, positional=[])
    if sh.unset_clause:
        unset.append((sh.unset_warning, sh.unset_clause))
    # ------------------------------------------------------------------ pick the launch
    if not sh.launches:
        if sh.inner_batches and depth == 0:
            inner_text, where, first_line = sh.inner_batches[0]
            # The job's script is read as the file it is in: its lines keep this file's numbers.
            inner = parse_script(path, "\n" * (first_line - 1) + inner_text, request=request, read_file=reader, env=env,
                                 default_gpus_per_node=default_gpn, work_dir=work_dir, _depth=1, _budget=budget)
            inner.warnings.insert(0, f"the job is the batch script submitted with a heredoc at {where}")
            res.__dict__.update(inner.__dict__)
            return
        # (the whole script was read: it names the file's last line, not one past its end)
        raise CannotPredict("no training launch found (deepy.py, deepspeed, torchrun, srun python …)",
                            f"{label}:{max(1, len(text.splitlines()))}")
    known = [l for l in sh.launches if l.classified.framework_hint != "unknown"]
    launch = known[0] if known else sh.launches[0]
    if len(sh.launches) > 1:
        warnings.append(f"{len(sh.launches)} launch commands; predicting the first ({launch.where})")
    _from_launch(res, launch, sh, u, req, prov, budget)


def _open_config(sh: Shell, launch: Launch, raw: str, where: str, kind: str, reader,
                 check_moe: bool = True) -> Config:
    cfg = _load_config(sh, launch, raw, where, kind, reader)
    if check_moe:
        # any framework's config that counts experts is refused here (NeMo checks after its overrides)
        moe.check_config(cfg)
    return cfg


def _load_config(sh: Shell, launch: Launch, raw: str, where: str, kind: str, reader) -> Config:
    text, p, line_origins = _config_text(sh, launch, raw, where, reader)
    return load_config(text, p, line_origins, kind)


_FILE_LINE = re.compile(r":\d+")


def _script_origin(origin: str, text: str, args: list, fallback: str) -> str:
    """``origin`` when it is a ``file:line``; else (a value from the environment, ``$HOME/ds.json``)
    the line that wrote the argument ending in ``text``, else ``fallback`` (the launch line)."""
    if _FILE_LINE.search(origin or ""):
        return origin
    for tok in args:
        if isinstance(tok, Tok) and text and tok.text.endswith(text):
            for _piece, seg_origin in tok.segs:
                if _FILE_LINE.search(seg_origin or ""):
                    return seg_origin
    return fallback


def _config_text(sh: Shell, launch: Launch, raw: str, where: str, reader) -> tuple[str, str, Optional[list]]:
    """(text, path, line origins) of a config: written by the script (vfs) or read as the user."""
    where = _script_origin(where, raw, getattr(launch.classified, "args", None) or [], launch.where)
    p = join_path(launch.cwd, raw)
    f = sh.vfs.get(p)
    if f is None and MARK_OPEN in raw:
        raise CannotPredict(f"config file name unknown: {sh.u.reason(raw)}", where)
    if f is not None:
        if f.unknown:
            raise CannotPredict(f"config {raw} is {f.unknown}", where)
        return f.text, p, f.line_origins
    try:
        data = reader(p)
    except (OSError, ValueError) as exc:
        raise CannotPredict(f"cannot read config {p}: {os_reason(exc)}", where) from None
    return sanitize_text(decode_text(data, p, MAX_CONFIG_BYTES)), p, None


def _from_launch(res: ParsedScript, launch: Launch, sh: Shell, u: Unknowns, req: SlurmRequest, prov: dict,
                 budget: Budget) -> None:
    c: Classified = launch.classified
    facts = Facts(u)
    framework = c.framework_hint
    world: Optional[World] = None
    reader = sh.read_file
    if framework == "neox":
        dargs = neox.read_deepy_args(c.args)
        if not dargs.confs:
            raise CannotPredict("deepy.py without config files", launch.where)
        if len(dargs.confs) > MAX_SOURCED_FILES:
            # (each is read and merged in full; a real launch names a handful)
            raise CannotPredict(f"deepy.py given {len(dargs.confs)} config files (more than {MAX_SOURCED_FILES})",
                                dargs.confs[MAX_SOURCED_FILES].origin_at(0))
        merged = neox.Merged()
        for tok in dargs.confs:
            budget.check_time(tok.origin_at(0))       # between files: each may take milliseconds
            name = tok.text
            if not re.search(r"\.(ya?ml|json)$", name):
                name += ".yml"
            if dargs.conf_dir:
                name = posixpath.join(dargs.conf_dir, name)
            merged.add(_open_config(sh, launch, name, tok.origin_at(0), "yaml", reader), facts.warnings)
        neox.read_merged(merged, facts)
        names = ", ".join(tok.text for tok in dargs.confs)
        for key, fact in (("num_layers", "layers"), ("hidden_size", "hidden"), ("num_attention_heads", "heads"),
                          ("seq_length", "seq_len")):
            if facts.get(fact) is None:
                raise CannotPredict(f"{key} is in none of the NeoX configs ({names})", launch.where)
        if dargs.hostfile is not None:
            facts.set("neox_hostfile", dargs.hostfile.text, dargs.hostfile.origin_at(0))
    elif framework == "torchtitan":
        cfg_tok, over = torchtitan.read_cli(c.args)
        if cfg_tok is None:
            raise CannotPredict("TorchTitan launch without --job.config_file", launch.where)
        text, p, line_origins = _config_text(sh, launch, cfg_tok.text, cfg_tok.origin_at(0), reader)
        world = _world(launch, c, facts, req, prov, sh, res.warnings)
        torchtitan.read(torchtitan.Toml(text, p, over, line_origins), facts,
                        None if world.unknown else world.gpus, world.origin)
    elif framework == "llm-foundry":
        cfg_tok, over = llmfoundry.read_cli(c.args, res.warnings)
        if cfg_tok is None:
            raise CannotPredict("llm-foundry launch without its YAML config (train.py X.yaml)", launch.where)
        if MARK_OPEN in cfg_tok.text:
            raise CannotPredict(f"llm-foundry config file name unknown: {sh.u.reason(cfg_tok.text)}",
                                cfg_tok.origin_at(0))
        world = _world(launch, c, facts, req, prov, sh, res.warnings)
        llmfoundry.read(_open_config(sh, launch, cfg_tok.text, cfg_tok.origin_at(0), "yaml", reader),
                        over, facts, None if world.unknown else world.gpus,
                        world.origin, world.per_node or req.gpus_per_node)
    elif framework == "nemo2":
        raise CannotPredict(nemo.NEMO2_REASON, launch.where)
    elif framework == "nemo":
        megatron.env_facts(facts, launch.env, launch.where)
        h = nemo.read_hydra_args(c.args)
        path, origin = nemo.config_file(h, c.script, launch.cwd)
        if MARK_OPEN in path:
            raise CannotPredict(f"NeMo config file name unknown: {sh.u.reason(path)}", origin)
        nemo.read(_open_config(sh, launch, path, origin, "yaml", reader, check_moe=False), h, facts)
    elif framework in ("megatron", "deepspeed", "unknown"):
        unread_flags = megatron.read_args(c.args, facts)
        megatron.env_facts(facts, launch.env, launch.where)
        if facts.get("layers") is None:
            _refuse_nemo2_script(sh, launch, c, reader)    # no shape on the command line: a recipe?
        megatron.check_moe(facts)
        is_ds = bool(facts.val("deepspeed") or facts.get("ds_config") is not None or
                     facts.get("cli_zero_stage") is not None or c.launcher == "deepspeed")
        if facts.get("ds_config") is not None:
            dsf = facts.get("ds_config")
            if dsf.unknown:
                raise CannotPredict(f"DeepSpeed config path unknown: {dsf.unknown}",
                                    _script_origin(dsf.origin, "", c.args, launch.where))
            ds_cfg = _open_config(sh, launch, dsf.value, dsf.origin, "json", reader)
            ds.read_config(ds_cfg, facts)
        if framework == "megatron" or facts.get("layers") is not None:
            framework = "megatron-deepspeed" if is_ds else "megatron"
            megatron.check_flags(unread_flags, facts.warnings, is_ds)
            megatron.derive_model(facts, is_ds)
        elif framework == "deepspeed" or is_ds:
            framework = "deepspeed"
        res.framework = framework
        if facts.get("layers") is None:
            # say why when some arguments could not be known (an unreadable $(cat args.txt))
            hidden = f"; arguments unknown: {facts.hidden_args}" if facts.hidden_args else ""
            raise CannotPredict(f"the model shape is not in the launch command of {c.script.text if c.script else '?'}"
                                f" (no --num-layers/--hidden-size{hidden})", launch.where)
    res.framework = framework
    facts.set("framework", framework, launch.where)
    if world is None:
        world = _world(launch, c, facts, req, prov, sh, res.warnings)
    if framework == "nemo":
        external = _external_ranks(launch, c)
        world = _nemo_world(world, facts, external)
        if not external:        # the ranks Lightning starts itself, against the request
            _check_request(world, _nemo_source(facts, world), req, prov, res.warnings)
    d = build(facts, framework, world, req, prov)
    res.warnings.extend(facts.warnings)
    res.warnings.extend(d.warnings)
    res.job_dict = d.job_dict
    res.provenance.update(d.provenance)
    for k in d.unresolved:
        if k not in res.unresolved:
            res.unresolved.append(k)
    res.exit_duration_minutes = d.exit_duration
    if d.error:
        reason, where = d.error
        raise CannotPredict(reason, where or launch.where)
    try:
        res.job = TrainingJob.from_dict(d.job_dict, source=launch.where)
    except JobError as exc:
        key = getattr(exc, "key", "")
        where = d.provenance.get(key, launch.where)
        msg = str(exc)
        if msg.startswith(f"{launch.where}: "):
            msg = msg[len(launch.where) + 2:]
        raise CannotPredict(msg, where) from None


def _refuse_nemo2_script(sh: Shell, launch: Launch, c: Classified, reader) -> None:
    """A Python script that builds a NeMo 2.0 recipe: read (never run) its text and refuse it."""
    if c.script is None or not c.script.text.endswith(".py") or MARK_OPEN in c.script.text:
        return
    p = join_path(launch.cwd, c.script.text)
    f = sh.vfs.get(p)
    if f is not None:
        text = f.text if not f.unknown else ""
    else:
        try:
            text = decode_text(reader(p), p, MAX_CONFIG_BYTES)
        except (OSError, ValueError, CannotPredict):
            return        # an unreadable script: the launch is judged by its arguments as before
    m = nemo.NEMO2_MARKERS.search(text or "")
    if m:
        raise CannotPredict(f"{nemo.NEMO2_REASON} ({p}:{text.count(chr(10), 0, m.start()) + 1} uses "
                            f"{m.group(0)[:40]})", launch.where)


def _nemo_world(world: World, facts: Facts, external: bool) -> World:
    """NeMo (Lightning) runs trainer.num_nodes × trainer.devices ranks. Started by a launcher
    (srun, torchrun, …) the launcher must start as many: Lightning's cluster environment refuses
    another number at start-up (``validate_settings``: SLURMEnvironment, TorchElasticEnvironment).
    Started as one process, Lightning starts trainer.devices processes itself."""
    for k in ("nemo_nodes", "nemo_devices"):
        fact = facts.get(k)
        if fact is not None and fact.unknown is not None:
            return World(unknown=fact.unknown, origin=fact.origin)
    if not (facts.known("nemo_nodes") and facts.known("nemo_devices")):
        return world
    nn, dev = facts.val("nemo_nodes"), facts.val("nemo_devices")
    if dev < 1 or nn < 1:
        # devices: -1 means every GPU the node has: the launcher's count stands
        return world
    if external and world.gpus is not None and world.gpus != nn * dev:
        raise CannotPredict(f"trainer.num_nodes × trainer.devices = {nn} × {dev} but the launch starts {world.gpus} "
                            f"process(es) ({world.origin}): Lightning stops at start-up unless they agree",
                            facts.origin("nemo_devices"))
    return World(nn * dev, facts.origin("nemo_devices"), dev)


def _nemo_source(facts: Facts, world: World) -> tuple[str, str]:
    return (f"trainer.devices = {world.per_node} starts {world.per_node} rank(s) per node",
            facts.origin("nemo_devices") or world.origin)


def _wrappers(launch: Launch, kind: str) -> list:
    return [w for w in launch.wrappers for w in (w if isinstance(w, list) else [w]) if w.kind == kind]


def _wrapper_opts(wrappers: list) -> dict:
    """The options of ``wrappers`` (:func:`_wrappers`), the later one's winning."""
    return {k: v for w in wrappers for k, v in w.opts}


def _external_ranks(launch: Launch, c: Classified) -> bool:
    """Whether something outside the training script starts its ranks (a launcher, srun, mpirun)."""
    return c.launcher != "none" or bool(_wrappers(launch, "srun") or _wrappers(launch, "mpirun"))


def _check_request(world: World, source: tuple[str, str], req: SlurmRequest, prov: dict, warnings: list,
                   gives: str = "the request gives") -> None:
    """Ranks per node against the GPUs the request gives a node (when it fixes them). More ranks
    than GPUs cannot run: each rank takes the GPU of its local rank, and those beyond the node's
    GPUs stop at start-up (CUDA "invalid device ordinal"). Fewer ranks run on fewer GPUs: that
    job is predicted, and said."""
    gpn, per = req.gpus_per_node, world.per_node
    if world.unknown or per is None or per < 1 or gpn is None or not prov.get(GPN_EXACT) or per == gpn:
        return
    what, origin = source
    gpn_origin = prov.get("request.gpus_per_node", "request")
    if per > gpn:
        beyond = f"rank {gpn}" if per == gpn + 1 else f"ranks {gpn}–{per - 1}"
        raise CannotPredict(f"{what} but {gives} a node {gpn} GPU(s) ({gpn_origin}): {beyond} of each "
                            f"node find no GPU and the job stops at start-up (CUDA: invalid device ordinal)", origin)
    nodes = f"{world.gpus // per} node(s) × {per}" if world.gpus and world.gpus % per == 0 else f"{per} per node"
    warnings.append(f"{what} ({origin}) but {gives} a node {gpn} GPUs ({gpn_origin}): the job runs on "
                    f"{per} of each node's {gpn} GPUs — predicting the {world.gpus} GPU(s) it uses ({nodes})")


def _rank_source(c: Classified, facts: Facts, launch: Launch, world: World) -> tuple[str, str]:
    """The clause "X starts N rank(s) per node", and where N is written."""
    opt, per = c.launcher_opts, f"{world.per_node} rank(s) per node"
    if c.launcher == "torchrun":
        tok = opt.get("nproc_per_node")
        if isinstance(tok, Tok):
            return f"torchrun --nproc_per_node {tok.text} starts {per}", facts.origin("tr_nproc") or tok.origin_at(0)
        return f"torchrun without --nproc_per_node starts {per}", launch.where
    if c.launcher == "composer" and isinstance(opt.get("nproc"), Tok):
        return f"composer -n {opt['nproc'].text} starts {per}", facts.origin("composer_nproc") or launch.where
    if c.launcher == "deepspeed" and facts.known("ds_num_gpus"):
        return (f"deepspeed --num_gpus {facts.val('ds_num_gpus')} starts {per}",
                facts.origin("ds_num_gpus") or launch.where)
    if c.launcher in ("deepspeed", "deepy"):
        return f"the {'NeoX' if c.launcher == 'deepy' else 'deepspeed'} launch starts {per}", world.origin
    if c.launcher == "none" and _wrappers(launch, "srun"):
        return (f"srun starts {world.gpus} task(s), {world.per_node} per node (one rank each)",
                world.origin or launch.where)
    return f"the launch starts {per}", world.origin or launch.where


def _int_opt(val, facts: Facts, key: str) -> Optional[int]:
    if val is None or val is True:
        return None
    if isinstance(val, Tok):
        facts.set_int(key, val)
        return facts.val(key)
    return None


def _world(launch: Launch, c: Classified, facts: Facts, req: SlurmRequest, prov: dict, sh: Shell,
           warnings: list) -> World:
    """The ranks the launch starts (and per node), checked against the GPUs the request gives a node."""
    world = _launch_world(launch, c, facts, req, prov, sh, warnings)
    gives = "the request gives"
    step_gpn = _int_text(_wrapper_opts(_wrappers(launch, "srun")).get("gpus-per-node"))
    if step_gpn and (req.gpus_per_node is None or step_gpn < req.gpus_per_node):
        # srun's own --gpus-per-node gives its step fewer GPUs than the job has: the ranks see those
        req = dataclasses.replace(req, gpus_per_node=step_gpn)
        prov = {**prov, GPN_EXACT: "srun --gpus-per-node", "request.gpus_per_node": launch.where}
        gives = f"srun --gpus-per-node={step_gpn} gives"
    _check_request(world, _rank_source(c, facts, launch, world), req, prov, warnings, gives)
    return world


def _launch_world(launch: Launch, c: Classified, facts: Facts, req: SlurmRequest, prov: dict, sh: Shell,
                  warnings: list) -> World:
    nodes, gpn = req.nodes, req.gpus_per_node
    if "request.nodes.invalid" in prov:
        return World(unknown=f"--nodes={prov['request.nodes.invalid']} is a list of node counts, not one number",
                     origin=prov.get("request.nodes", ""))
    srun = _wrappers(launch, "srun")
    srun_opts = _wrapper_opts(srun)
    if c.launcher == "torchrun":
        nn_tok, np_tok = c.launcher_opts.get("nnodes"), c.launcher_opts.get("nproc_per_node")
        nn = 1
        origin = launch.where
        if isinstance(nn_tok, Tok):
            t, least = nn_tok.text, None
            if ":" in t and MARK_OPEN not in t:
                # torchrun's parse_min_max_nnodes and its rendezvous' checks, at start-up
                parts = t.split(":")
                least, t = (_int_text(parts[0]), parts[-1]) if len(parts) == 2 else (None, "")
                most = _int_text(t)
                if least is None or most is None or least < 1 or most < least:
                    why = ("is not in MIN:MAX format" if len(parts) != 2 or least is None or most is None
                           else "has a minimum below 1" if least < 1 else "has a maximum below its minimum")
                    raise CannotPredict(f"torchrun --nnodes {nn_tok.text} {why}: torchrun stops at start",
                                        nn_tok.origin_at(0) or launch.where)
            facts.set_int("tr_nnodes", Tok(t, nn_tok.segs), what="--nnodes")
            if not facts.known("tr_nnodes"):
                return World(unknown=facts.get("tr_nnodes").unknown, origin=facts.origin("tr_nnodes"))
            nn, origin = facts.val("tr_nnodes"), facts.origin("tr_nnodes")
            # one agent per node where srun starts torchrun on each (srun -N: on that many)
            agents = min(filter(None, (_int_text(srun_opts.get("nodes")), req.nodes)), default=None) if srun else None
            nn = _rendezvous_nodes(nn_tok.text, least if least is not None else nn, nn, req, agents,
                                   prov.get("request.nodes", "request"), origin, warnings)
        per = 1
        if isinstance(np_tok, Tok):
            if np_tok.text in ("gpu", "auto", "cuda"):
                per = gpn or 1
            else:
                facts.set_int("tr_nproc", np_tok, what="--nproc_per_node")
                if not facts.known("tr_nproc"):
                    return World(unknown=facts.get("tr_nproc").unknown, origin=facts.origin("tr_nproc"))
                per = facts.val("tr_nproc")
        if nodes and nn != nodes:
            given = f"--nnodes {nn}" if isinstance(nn_tok, Tok) else "without --nnodes (1)"
            warnings.append(f"torchrun {given} but the job has {nodes} node(s) ({origin})")
        return World(nn * per, origin, per)
    if c.launcher == "composer":
        return _composer_world(c, facts, req, prov, launch, warnings)
    if c.launcher == "deepy" and srun:
        warnings.append("deepy.py under srun starts one launcher per task (pattern: run deepy.py once; "
                        "with launcher: slurm DeeperSpeed calls srun itself)")
    if c.launcher in ("deepspeed", "deepy"):
        return _hostfile_world(launch, c, facts, req, prov, sh, warnings)
    mpi = _wrappers(launch, "mpirun")
    if mpi:
        opts = _wrapper_opts(mpi)
        for k in ("np", "n", "c"):
            if opts.get(k):
                n = _int_text(opts[k])
                if n:
                    return World(n, launch.where, None)
    if srun:
        nt = _int_text(srun_opts.get("ntasks"))
        nt_origin = launch.where     # where the task count comes from: srun's own option first
        if nt is None and srun_opts.get("ntasks-per-node"):
            per = _int_text(srun_opts.get("ntasks-per-node"))
            nn = _int_text(srun_opts.get("nodes")) or nodes
            if per and nn:
                return World(per * nn, launch.where, per)
        if nt is None:
            if req.ntasks:
                nt, nt_origin = req.ntasks, prov.get("request.ntasks", launch.where)
            elif req.ntasks_per_node and nodes:
                nt, nt_origin = req.ntasks_per_node * nodes, prov.get("request.ntasks_per_node", launch.where)
            elif nodes:
                nt, nt_origin = nodes, prov.get("request.nodes", launch.where)
        if nt is None:
            return World(unknown="number of tasks unknown", origin=launch.where)
        per = (nt // nodes) if nodes and nt % nodes == 0 else None
        if gpn and nodes and nt != nodes * gpn and (per is None or not prov.get(GPN_EXACT)):
            # (with the request's own GPU count, _check_request says it)
            warnings.append(f"srun starts {nt} task(s) (one rank each) on {nodes} node(s) with {gpn} GPU(s) each "
                            f"({nt_origin})")
        return World(nt, nt_origin, per)
    if nodes and gpn and nodes * gpn > 1 and c.framework_hint != "nemo":    # Lightning starts NeMo's ranks
        warnings.append(f"the training script runs as a single process (no srun/torchrun/deepspeed): "
                        f"it uses 1 GPU of the {nodes * gpn} requested")
    return World(1, launch.where, None)


def _composer_world(c: Classified, facts: Facts, req: SlurmRequest, prov: dict, launch: Launch,
                    warnings: list) -> World:
    """Composer's launcher starts -n (default: the node's GPUs) processes of a --world_size (default:
    -n) job; one launcher runs per node."""
    per = None
    per_origin = prov.get("request.gpus_per_node", launch.where)
    tok = c.launcher_opts.get("nproc")
    if isinstance(tok, Tok):
        facts.set_int("composer_nproc", tok, what="composer -n")
        if not facts.known("composer_nproc"):
            return World(unknown=facts.get("composer_nproc").unknown, origin=facts.origin("composer_nproc"))
        per, per_origin = facts.val("composer_nproc"), facts.origin("composer_nproc")
    elif req.gpus_per_node:
        per = req.gpus_per_node
    tok = c.launcher_opts.get("world_size")
    if isinstance(tok, Tok):
        facts.set_int("composer_world", tok, what="composer --world_size")
        if not facts.known("composer_world"):
            return World(unknown=facts.get("composer_world").unknown, origin=facts.origin("composer_world"))
        return World(facts.val("composer_world"), facts.origin("composer_world"), per)
    if per is None:
        return World(unknown="composer -n not given and the GPUs per node unknown", origin=launch.where)
    if req.nodes and req.nodes > 1:
        warnings.append(f"composer without --world_size runs a {per}-GPU job on each of the {req.nodes} nodes "
                        f"(predicting one of them)")
    return World(per, per_origin, per)


def _rendezvous_nodes(text: str, least: int, most: int, req: SlurmRequest, agents: Optional[int],
                      req_origin: str, origin: str, warnings: list) -> int:
    """The nodes torchrun's rendezvous trains on for ``--nnodes text`` (``least:most``, or one
    count) when srun starts one agent on each of ``agents`` nodes (None: torchrun is not started
    by srun, and how many agents join is not known here: the count is taken as written).  The
    rendezvous completes once ``least`` agents have joined (at once at ``most``) and fails at its
    timeout, without training, if fewer ever join: a job whose nodes cannot reach ``least``
    never trains."""
    if agents is not None and req.nodes:
        if agents != req.nodes:      # srun -N: fewer nodes than the job has run an agent
            upto, have, advice = agents, f"srun starts it on {agents} node(s) (srun -N {agents})", f"{agents}"
            joined = f"srun's {agents} node(s)"
        else:
            upto = req.max_nodes
            have = (f"the job has {agents} node(s) ({req_origin})" if upto == agents else
                    f"the job has at most {upto} node(s) (--nodes={agents}-{upto}, {req_origin})")
            advice, joined = f"{agents} (or $SLURM_NNODES)", f"the job's {agents} node(s) ({req_origin})"
        if upto and upto < least:
            raise CannotPredict(f"torchrun --nnodes {text} waits for {least} node(s) to join its rendezvous but "
                                f"{have}: the rendezvous never completes and the job ends at its timeout "
                                f"without training; give --nnodes {advice}", origin)
        if least <= agents < most:
            warnings.append(f"torchrun --nnodes {text}: {joined} join its rendezvous: predicting for {agents} "
                            f"({origin})")
            return agents
    if least != most:
        warnings.append(f"torchrun --nnodes {text}: predicting for the maximum {most} ({origin})")
    return most


def _int_text(t) -> Optional[int]:
    if t is None:
        return None
    m = re.fullmatch(r"\s*(\d+)", str(t))
    return int(m.group(1)) if m else None


def _hostfile_world(launch: Launch, c: Classified, facts: Facts, req: SlurmRequest, prov: dict, sh: Shell,
                    warnings: list) -> World:
    nodes, gpn = req.nodes, req.gpus_per_node
    req_origin = prov.get("request.nodes", "request")
    if c.launcher == "deepy":
        if facts.get("global_num_gpus") is not None:
            g = facts.get("global_num_gpus")
            if g.unknown:
                return World(unknown=g.unknown, origin=g.origin)
            return World(g.value, g.origin, None)
        hf = facts.val("neox_hostfile") or launch.env.get("DLTS_HOSTFILE")
        hf_origin = facts.origin("neox_hostfile") or launch.where
        num_nodes = facts.val("neox_num_nodes", -1)
        num_gpus = facts.val("neox_num_gpus")
    else:
        hf_tok = c.launcher_opts.get("hostfile")
        hf = hf_tok.text if isinstance(hf_tok, Tok) else launch.env.get("DLTS_HOSTFILE")
        hf_origin = hf_tok.origin_at(0) if isinstance(hf_tok, Tok) else launch.where
        num_nodes = _int_opt(c.launcher_opts.get("num_nodes"), facts, "ds_num_nodes") or -1
        num_gpus = _int_opt(c.launcher_opts.get("num_gpus"), facts, "ds_num_gpus")
    hosts = _read_hostfile(hf, launch, sh) if hf else None
    if isinstance(hosts, tuple):
        per = hosts[1]
        gp = num_gpus or per or gpn
        n = nodes if num_nodes in (-1, None) else min(num_nodes, nodes or num_nodes)
        if not n or not gp:
            return World(unknown="hostfile written at run time and node count unknown", origin=hf_origin)
        return World(n * gp, hf_origin if per else req_origin, gp)
    if isinstance(hosts, list) and hosts:
        if num_nodes and num_nodes > 0:
            hosts = hosts[:num_nodes]
        total = sum(num_gpus or s for s in hosts)
        return World(total, hf_origin, num_gpus or (hosts[0] if len(set(hosts)) == 1 else None))
    # no usable hostfile
    if c.launcher == "deepspeed" and not hf:
        n = 1 if num_nodes in (-1, None) else num_nodes
        if num_nodes not in (-1, None) and num_nodes > 1:
            # deepspeed/launcher/runner.py: "Num nodes is >1 but no extra nodes available via hostfile"
            raise CannotPredict(f"deepspeed --num_nodes {num_nodes} without --hostfile: the deepspeed launcher stops "
                                f"at start-up (\"Num nodes is >1 but no extra nodes available via hostfile\")",
                                facts.origin("ds_num_nodes") or launch.where)
        if nodes and nodes > 1 and n == 1:
            warnings.append("the deepspeed launcher without --hostfile runs on this node only")
        per = num_gpus or gpn
        if not per:
            return World(unknown="GPUs per node unknown", origin=launch.where)
        return World(n * per, facts.origin("ds_num_gpus") or prov.get("request.gpus_per_node", launch.where), per)
    n = nodes if num_nodes in (-1, None) else num_nodes
    per = num_gpus or gpn
    if not n or not per:
        return World(unknown="nodes × GPUs per node unknown", origin=req_origin)
    return World(n * per, req_origin, per)


def _read_hostfile(path: str, launch: Launch, sh: Shell):
    """[slots per host] | ("unknown-hosts", slots) (written by a loop over the node list) | None."""
    if MARK_OPEN in path:
        return None
    p = join_path(launch.cwd, path)
    f = sh.vfs.get(p)
    if f is not None:
        if f.unknown:
            return None
        text = f.text
    else:
        try:
            text = decode_text(sh.read_file(p), p, MAX_CONFIG_BYTES)
        except (OSError, ValueError, CannotPredict):
            return None
    slots = []
    unknown_host = False
    loop_slots = None
    for line in text.splitlines()[:10_000]:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.search(r"slots\s*=\s*(\d+)", line)
        if MARK_OPEN in line.split()[0]:
            unknown_host = True
            if m:
                loop_slots = int(m.group(1))
            continue
        slots.append(int(m.group(1)) if m else 1)
    if unknown_host:
        return ("unknown-hosts", loop_slots)
    return slots
