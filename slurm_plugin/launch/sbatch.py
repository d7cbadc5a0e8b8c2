"""#SBATCH directives -> SlurmRequest, and the request's derived numbers (GPUs, tasks, SLURM_* env).

sbatch reads directives only from lines that start exactly with ``#SBATCH`` and stops at the first
line that is neither blank nor a comment; the rest of a directive line is tokenised like a shell
command line (quotes, several options, trailing ``# comment``).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, fields
from typing import Optional

from .limits import Budget, CannotPredict
from .neox_keys import suggest
from .result import SlurmRequest

log = logging.getLogger(__name__)

# Long options that never take a separate value (optional-argument ones only take `=value`).
_NOARG_LONG = {
    "exclusive", "overcommit", "hold", "requeue", "no-requeue", "contiguous", "wait", "parsable",
    "quiet", "verbose", "use-min-nodes", "spread-job", "test-only", "ignore-pbs", "no-kill",
    "oversubscribe", "reboot", "nice", "get-user-env", "help", "usage", "version", "wrap-noop",
    "kill-on-invalid-dep-noop", "exact", "whole", "unbuffered", "label", "multi-prog", "pty",
}
# Short options that take a value (sbatch/srun getopt strings).
_ARG_SHORT = set("AabcCdDeFGiJLMmnNopqSTtwxKW")
_NOARG_SHORT = set("hHIkOQsvVXluZ")

_SHORT_TO_LONG = {
    "N": "nodes", "n": "ntasks", "c": "cpus-per-task", "G": "gpus", "p": "partition",
    "t": "time", "a": "array", "J": "job-name", "D": "chdir", "A": "account",
}


# sbatch's long options (sbatch(1), Slurm 22.05 -- each one checked against its sbatch, with
# "cluster", an alias its table has beside "clusters" -- plus container-id, extra and
# tres-per-task, which later releases added); sbatch reads them with getopt_long, which takes an
# unambiguous prefix for the whole name.  (--workdir, chdir's name before Slurm 17.11, is refused.)
SBATCH_LONG = frozenset("""
account acctg-freq array batch bb bbf begin chdir cluster cluster-constraint clusters comment constraint container
container-id contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot
dependency distribution error exclude exclusive export export-file extra extra-node-info get-user-env gid
gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags help hint hold ignore-pbs
input job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu
mincpus network nice no-kill no-requeue nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu
ntasks-per-node ntasks-per-socket open-mode output overcommit oversubscribe parsable partition power prefer
priority profile propagate qos quiet reboot requeue reservation signal sockets-per-node spread-job switches
test-only thread-spec threads-per-core time time-min tmp tres-per-task uid usage use-min-nodes verbose version
wait wait-all-nodes wckey wrap
""".split())


def _long_option(name: str, where: str, warnings: list) -> Optional[str]:
    """The sbatch option ``--name`` means (itself, or the one option it is a prefix of), else None
    with a warning: sbatch refuses an unknown or ambiguous option and submits nothing."""
    if name in SBATCH_LONG:
        return name
    hits = [o for o in SBATCH_LONG if o.startswith(name)] if name else []
    if len(hits) == 1:
        return hits[0]
    if hits:
        warnings.append(f"#SBATCH --{name} is ambiguous (--{', --'.join(sorted(hits))}): sbatch refuses it and "
                        f"submits nothing; ignored ({where})")
        return None
    guess = suggest(name, SBATCH_LONG)
    near = f"; did you mean --{guess}?" if guess else ""
    warnings.append(f"#SBATCH --{name} is not an sbatch option: sbatch refuses it (unrecognized option) and "
                    f"submits nothing; ignored ({where}){near}")
    return None


# A directive line longer than this is not read (with a warning naming the line): real ones are
# well under 1 KiB, and a megabyte-long --comment must not cost the daemon its deadline.
MAX_DIRECTIVE_CHARS = 64 << 10
# Likewise for words: a real directive line holds a handful of options; thousands only cost time.
MAX_DIRECTIVE_WORDS = 1024

# One shell word of a directive line: unquoted runs, backslash escapes, '...' and "..." (with
# escapes inside), in any sequence.  Every alternative consumes input, so matching is linear.
# An unquoted '#' starts a comment, inside a word too (as shlex, which this replaces, has it).
_PIECE = r"[^\s'\"\\#]+|\\[\s\S]|'[^']*'|" + r'"[^"\\]*(?:\\[\s\S][^"\\]*)*"'
_WORD_RE = re.compile(rf"\s*((?:{_PIECE})+)")
_PART_RE = re.compile(r"\\([\s\S])|'([^']*)'|" + r'"([^"\\]*(?:\\[\s\S][^"\\]*)*)"' + r"|([^'\"\\]+)")
_DQ_ESCAPE_RE = re.compile(r'\\(["\\])')
_QUOTING = frozenset("'\"\\#")     # without any of these a directive line is its blank-separated words


def split_directive(text: str) -> list[str]:
    """Split a directive line into words as sbatch does (POSIX quoting, ``#`` starts a comment
    at the start of a word), in time linear in the line's length.

    Raises ValueError for an unbalanced quote or a trailing backslash (as shlex would).
    """
    if _QUOTING.isdisjoint(text):
        return text.split()     # str.split's blanks are the regex's \s and str.isspace's
    words: list[str] = []
    pos, n = 0, len(text)
    while True:
        while pos < n and text[pos].isspace():
            pos += 1
        if pos >= n or text[pos] == "#":
            return words
        m = _WORD_RE.match(text, pos)
        if m is None:
            raise ValueError("no closing quotation" if text[pos] in "'\"" else "no escaped character")
        pos = m.end()
        if pos < n and text[pos] == "#":
            n = pos         # the rest of the line is a comment; this word ends here
        elif pos < n and not text[pos].isspace():
            # what stopped the word is an unterminated quote or a lone trailing backslash
            raise ValueError("no closing quotation" if text[pos] in "'\"" else "no escaped character")
        out = []
        for esc, single, double, plain in _PART_RE.findall(m.group(1)):
            if plain or single:
                out.append(plain or single)
            elif double:
                out.append(_DQ_ESCAPE_RE.sub(r"\1", double))
            else:
                out.append(esc)
        words.append("".join(out))


def split_options(tokens: list[str], stop_at_command: bool = False) -> tuple[list[tuple[str, Optional[str], int]], int]:
    """Parse sbatch/srun-style options -> ([(long name, value or None, token index)], index after).

    With ``stop_at_command`` the first non-option token ends the options (srun CMD ...).
    """
    out: list[tuple[str, Optional[str], int]] = []
    i = 0
    n = len(tokens)
    while i < n:
        tok = tokens[i]
        if tok == "--":
            return out, i + 1
        if tok.startswith("--") and len(tok) > 2:
            name, eq, val = tok[2:].partition("=")
            if eq:
                out.append((name, val, i))
            elif name in _NOARG_LONG or i + 1 >= n:
                out.append((name, None, i))
            else:
                out.append((name, tokens[i + 1], i))
                i += 1
            i += 1
            continue
        if tok.startswith("-") and len(tok) > 1 and not tok[1].isdigit():
            j = 1
            while j < len(tok):
                ch = tok[j]
                name = _SHORT_TO_LONG.get(ch, ch)
                if ch in _ARG_SHORT:
                    rest = tok[j + 1:]
                    if rest.startswith("="):
                        rest = rest[1:]
                    if rest:
                        out.append((name, rest, i))
                    elif i + 1 < n:
                        out.append((name, tokens[i + 1], i))
                        i += 1
                    else:
                        out.append((name, None, i))
                    break
                out.append((name, None, i))
                j += 1
            i += 1
            continue
        if stop_at_command:
            return out, i
        i += 1  # a stray word on a directive line: sbatch would complain; we skip it
    return out, i


_TIME_RE = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
_PAREN_TAIL = re.compile(r"\(.*\)$")
_LEADING_INT = re.compile(r"\s*(\d+)")


def parse_time_minutes(text: str) -> Optional[int]:
    """Slurm time formats -> minutes (rounded up); None for unlimited or unparsable."""
    t = text.strip().lower()
    if t in ("unlimited", "infinite", "-1", ""):
        return None
    m = _TIME_RE.fullmatch(t)
    if not m:
        return None
    days, a, b, c = m.groups()
    if days is not None:            # D-H, D-H:M, D-H:M:S
        d, h = int(days), int(a)
        mi = int(b) if b else 0
        s = int(c) if c else 0
    elif c is not None:             # H:M:S
        d, h, mi, s = 0, int(a), int(b), int(c)
    elif b is not None:             # M:S
        d, h, mi, s = 0, 0, int(a), int(b)
    else:                           # M
        d, h, mi, s = 0, 0, int(a), 0
    total = d * 1440 + h * 60 + mi + (1 if s else 0)
    return total


def gres_gpus(text: str) -> Optional[int]:
    """--gres=gpu[:type]:N[,other...] -> N (gpu alone = 1)."""
    for item in text.split(","):
        item = item.strip()
        if "(" in item:
            item = _PAREN_TAIL.sub("", item)
        parts = item.split(":")
        if parts[0] not in ("gpu", "gres/gpu"):
            continue
        if len(parts) == 1:
            return 1
        if parts[-1].isdigit():
            return int(parts[-1])
        return 1  # gpu:type means one GPU of that type
    return None


# What sbatch accepts, from Slurm's own option parsing (src/common/slurm_opt.c, proc_args.c,
# parse_time.c): sbatch stops with the quoted message before it submits anything, so a script
# carrying one of these values never runs and is not predicted.
# verify_node_count: N, Nk (x1024), Nm; in MIN-MAX either side may be empty (MIN 1, MAX none)
_NODE_COUNT = re.compile(r"\s*(\d+)([kKmM]?)\s*")
_NODE_SIZES = re.compile(r"[\d\s,:kKmM-]*[,:][\d\s,:kKmM-]*")    # a size list of later Slurm (1,4-8:2): not read
_POSITIVE_INT = re.compile(r"\s*\+?(\d+)")                 # parse_int(name, arg, positive=true): strtol
_GPU_COUNT = re.compile(r"(?:([^:]+):)?(\d+)")               # --gpus*=[type:]N
_NUMBER_WORDS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "twenty thirty thirty-two thirtytwo forty forty-eight sixty-four sixtyfour".split())
_NOT_A_TYPE = re.compile(r"[+-]?\d*\.\d+|[+-]\d+")       # a count gone wrong where a type may stand
_SCALE = {"": 1, "k": 1024, "m": 1024 * 1024}


def _written(tokens: list[str], i: int, val: Optional[str]) -> str:
    """The option as the line writes it (``--nodes=0``, ``-N 0``)."""
    tok = tokens[i]
    return tok if val is None or tok.endswith(val) else f"{tok} {val}"


def _node_count(val: str, shown: str, where: str) -> tuple[Optional[int], Optional[int]]:
    """(min, max or 0) nodes of --nodes as Slurm's verify_node_count reads it; (None, None) for a
    size list of later releases; CannotPredict for what sbatch refuses."""
    lo_text, dash, hi_text = val.partition("-")
    if _NODE_SIZES.fullmatch(val) and any(c.isdigit() for c in val):
        return None, None
    counts = []
    for part in ((lo_text, hi_text) if dash else (val,)):
        m = _NODE_COUNT.fullmatch(part)
        if m is None and not (dash and not part.strip()):
            raise CannotPredict(f"#SBATCH {shown} is not a node count: sbatch refuses it "
                                f"(\"{part.strip() or val}\" is not a valid node count) and submits nothing; it "
                                f"takes N or MIN-MAX with N >= 1", where)
        counts.append(int(m.group(1)) * _SCALE[m.group(2).lower()] if m else 0)
    if not dash and counts[0] == 0:
        raise CannotPredict(f"#SBATCH {shown} is not a node count sbatch accepts: it refuses 0 "
                            f"(\"{val.strip()}\" is not a valid node count) and submits nothing; give N >= 1 "
                            f"or MIN-MAX", where)
    lo, hi = max(counts[0], 1), counts[-1]     # a range from 0 (or from nothing) starts at 1
    if dash and hi and hi < lo:
        raise CannotPredict(f"#SBATCH {shown}: sbatch refuses it (maximum node count {hi} is less than "
                            f"minimum node count {lo}) and submits nothing", where)
    return lo, hi


def _positive(val: str, shown: str, option: str, where: str) -> int:
    """parse_int(option, val, positive=true): a whole number above 0, else sbatch stops."""
    m = _POSITIVE_INT.fullmatch(val)
    if m is None or int(m.group(1)) == 0:
        raise CannotPredict(f"#SBATCH {shown} is not a count sbatch accepts: it stops with "
                            f"'Invalid numeric value \"{val}\" for {option}' and submits nothing; it takes a "
                            f"whole number >= 1", where)
    return int(m.group(1))


def _gpu_count(val: str, shown: str, where: str) -> int:
    """--gpus / --gpus-per-node / --gpus-per-task = [type:]N[,[type:]N...] (sbatch(1): a list of
    types, e.g. volta:3,kepler:1; their sum); anything else Slurm refuses."""
    total = 0
    for item in val.split(","):
        m = _GPU_COUNT.fullmatch(item.strip())
        if m is None:
            raise CannotPredict(f"#SBATCH {shown} is not a GPU count: sbatch takes [type:]N[,[type:]N] (8, h100:8, "
                                f"a100:4,v100:4) and Slurm refuses the job", where)
        total += int(m.group(2))
    return total


def _gres_gpus_checked(val: str, shown: str, where: str) -> Optional[int]:
    """gres_gpus, after refusing a GPU count Slurm cannot read: gpu[:type][:count] takes a word
    after gpu: as a GPU type, so 'gpu:eight' asks for one GPU of a type no node has."""
    for item in val.split(","):
        parts = _PAREN_TAIL.sub("", item.strip()).split(":")
        if parts[0] not in ("gpu", "gres/gpu") or len(parts) == 1:
            continue
        last = parts[-1]
        bad = (len(parts) > 3 or "" in parts[1:] or (len(parts) == 3 and not last.isdigit())
               or (not last.isdigit() and (last.lower() in _NUMBER_WORDS or _NOT_A_TYPE.fullmatch(last))))
        if bad:
            raise CannotPredict(f"#SBATCH {shown}: {last!r} is not a GPU count (gpu[:type][:count], count a "
                                f"whole number: gpu:8, gpu:h100:8); Slurm reads a word there as a GPU type "
                                f"and refuses the job", where)
    return gres_gpus(val)


def _time_limit(val: str, shown: str, where: str) -> Optional[int]:
    """parse_time_minutes, after refusing what time_str2mins cannot read."""
    t = val.strip().lower()
    if t not in ("unlimited", "infinite", "-1", "") and not _TIME_RE.fullmatch(t):
        raise CannotPredict(f"#SBATCH {shown} is not a time limit sbatch accepts: it stops with 'Invalid --time "
                            f"specification' and submits nothing; it takes MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                            f"D-HH:MM:SS or UNLIMITED", where)
    return parse_time_minutes(val)


@dataclass
class Directives:
    """What the #SBATCH header (or a command line) said, with raw GPU spellings kept apart."""

    request: SlurmRequest = field(default_factory=SlurmRequest)
    provenance: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    gpus_total: Optional[int] = None
    gpus_per_task: Optional[int] = None
    chdir: Optional[str] = None
    header_end_line: int = 0


def apply_options(d: Directives, tokens: list[str], where: str) -> None:
    """Apply one line's options (later options override earlier ones, as in sbatch).

    A value sbatch refuses (``--nodes=0``, ``--gpus-per-node=eight``, ``--time=4hours``) stops the
    prediction naming the line: sbatch submits nothing, so there is no job to predict."""
    opts, _ = split_options(tokens)
    r = d.request
    for name, val, i in opts:
        prov_key = None
        if name not in SBATCH_LONG and len(name) > 1 and tokens[i].startswith("--"):
            full = _long_option(name, where, d.warnings)
            if full is None:
                continue
            name = full
        shown = _written(tokens, i, val)
        if val is None and name in _COUNTED:
            raise CannotPredict(f"#SBATCH {shown} without a value: sbatch refuses it and submits nothing", where)
        v = val if val is not None else ""
        if name == "nodes":
            lo, hi = _node_count(v, shown, where)
            if lo is None:
                d.warnings.append(f"--nodes={val} is a list of node counts that perfcast does not read ({where})")
                r.nodes = None
                d.provenance["request.nodes"] = where
                d.provenance["request.nodes.invalid"] = str(val)
                continue
            if "-" in v.strip() and hi != lo:
                d.warnings.append(f"--nodes={val} is a range; predicting for its minimum {lo} ({where})")
            r.nodes, prov_key = lo, "nodes"
            r.max_nodes = hi if "-" in v else lo
            d.provenance.pop("request.nodes.invalid", None)
        elif name == "ntasks":
            r.ntasks, prov_key = _positive(v, shown, "--ntasks", where), "ntasks"
        elif name == "ntasks-per-node":
            r.ntasks_per_node, prov_key = _positive(v, shown, "--ntasks-per-node", where), "ntasks_per_node"
        elif name == "cpus-per-task":
            r.cpus_per_task, prov_key = _positive(v, shown, "--cpus-per-task", where), "cpus_per_task"
        elif name == "gpus-per-node":
            r.gpus_per_node, prov_key = _gpu_count(v, shown, where), "gpus_per_node"
        elif name == "gres":
            g = _gres_gpus_checked(v, shown, where)
            if g is not None:
                r.gpus_per_node, prov_key = g, "gpus_per_node"
        elif name == "gpus":
            d.gpus_total = _gpu_count(v, shown, where)
            d.provenance["request.gpus"] = where
        elif name == "gpus-per-task":
            d.gpus_per_task = _gpu_count(v, shown, where)
            d.provenance["request.gpus_per_task"] = where
        elif name == "partition":
            r.partition, prov_key = val, "partition"
        elif name == "time":
            r.time_limit_minutes, prov_key = _time_limit(v, shown, where), "time_limit_minutes"
        elif name == "array":
            r.array, prov_key = val, "array"
        elif name == "job-name":
            r.job_name, prov_key = val, "job_name"
        elif name == "chdir":
            d.chdir = val
        if prov_key:
            d.provenance[f"request.{prov_key}"] = where


# The options whose values are read as numbers above: without a value sbatch refuses the line.
_COUNTED = frozenset({"nodes", "ntasks", "ntasks-per-node", "cpus-per-task", "gpus-per-node", "gres", "gpus",
                      "gpus-per-task", "time"})


def read_directives(text: str, label: str, budget: Optional[Budget] = None) -> Directives:
    """Scan the header of a batch script for #SBATCH lines (never past the first command)."""
    d = Directives()
    budget = budget or Budget()
    lineno = 0
    pos = 0
    n = len(text)
    while pos <= n:
        # line by line without splitting the whole (maybe 4 MiB) text: the header is short
        nl = text.find("\n", pos)
        line_at = pos
        line = text[pos:] if nl < 0 else text[pos:nl]
        pos = n + 1 if nl < 0 else nl + 1
        lineno += 1
        budget.tick_at(label, lineno)
        s = line.strip()
        if not s:
            continue
        if not s.startswith("#"):
            _late_directive(d, text, line_at, label, lineno)
            break
        if not line.startswith("#SBATCH"):
            continue   # '# #SBATCH', '##SBATCH' and indented ones are comments to sbatch
        rest = line[len("#SBATCH"):]
        if rest and not rest[0].isspace():
            continue   # '#SBATCHX'
        where = f"{label}:{lineno}"
        if len(rest) > 4096:
            budget.check_time(where)    # long lines are rare and each costs up to milliseconds
        if len(rest) > MAX_DIRECTIVE_CHARS:
            d.warnings.append(f"#SBATCH directive of {len(rest)} characters not read (longer than "
                              f"{MAX_DIRECTIVE_CHARS}; {where})")
            continue
        try:
            tokens = split_directive(rest)
        except ValueError:
            d.warnings.append(f"unbalanced quotes in #SBATCH directive ignored ({where})")
            continue
        if len(tokens) > MAX_DIRECTIVE_WORDS:
            d.warnings.append(f"#SBATCH directive of {len(tokens)} words not read (more than "
                              f"{MAX_DIRECTIVE_WORDS}; {where})")
            continue
        apply_options(d, tokens, where)
    d.header_end_line = lineno
    return d


_REQUEST_FIELDS = tuple(f.name for f in fields(SlurmRequest))


def _late_directive(d: Directives, text: str, command_at: int, label: str, command_line: int) -> None:
    """Say the first ``#SBATCH`` line after the first command: sbatch stops reading directives
    there, so the option it sets is not the job's (a user who adds one at the end of the script
    gets the default without a word from sbatch).  Not one after a ``<<`` (a heredoc's, as a
    script written or submitted by this one).  One search, not a scan of every line."""
    i = text.find("\n#SBATCH", command_at)
    for _ in range(16):         # past '#SBATCHX' lines, a few (a script of them is not worth a scan)
        if i < 0 or i + 8 >= len(text) or text[i + 8].isspace():
            break
        i = text.find("\n#SBATCH", i + 8)
    else:
        return
    if i < 0 or text.find("<<", command_at, i) >= 0:
        return
    line = text.count("\n", 0, i) + 2
    d.warnings.append(f"#SBATCH line after the script's first command ({label}:{command_line}) is ignored by "
                      f"sbatch: move it above that command ({label}:{line})")


def merge_request(script: Directives, caller: Optional[SlurmRequest]) -> tuple[SlurmRequest, dict[str, str]]:
    """Caller's (command line) values win over the script's."""
    out = SlurmRequest(**script.request.__dict__)
    prov = dict(script.provenance)
    if caller is not None:
        for name in _REQUEST_FIELDS:
            v = getattr(caller, name)
            if name == "max_nodes":
                if caller.nodes is not None:
                    out.max_nodes = v    # the script's maximum belongs to the script's count
            elif v is not None:
                setattr(out, name, v)
                prov[f"request.{name}"] = "request"
                prov.pop(f"request.{name}.invalid", None)
                if name == "gpus_per_node":
                    script.gpus_total = None
                    script.gpus_per_task = None
    return out, prov


# provenance key (kept out of the answer's provenance) set when the request fixes the GPUs each
# node has -- not a platform default or a guess -- so a launcher that disagrees can be judged
GPN_EXACT = "request.gpus_per_node.exact"


def derive_request(req: SlurmRequest, d: Directives, prov: dict[str, str],
                   default_gpus_per_node: Optional[int], warnings: list[str]) -> None:
    """Fill GPUs per node and nodes from the other spellings, in place."""
    if req.gpus_per_node is not None:
        prov[GPN_EXACT] = "--gpus-per-node/--gres"
    if req.gpus_per_node is None and d.gpus_per_task is not None:
        per_node_tasks = req.ntasks_per_node
        if per_node_tasks is None and req.ntasks is not None and req.nodes:
            per_node_tasks = max(1, req.ntasks // req.nodes)
        if per_node_tasks is not None:
            req.gpus_per_node = d.gpus_per_task * per_node_tasks
            prov["request.gpus_per_node"] = prov.get("request.gpus_per_task", "")
            if req.ntasks_per_node is not None or (req.ntasks or 0) % (req.nodes or 1) == 0:
                prov[GPN_EXACT] = "--gpus-per-task"
    if req.gpus_per_node is None and d.gpus_total is not None:
        if req.nodes:
            req.gpus_per_node = max(1, d.gpus_total // req.nodes)
            if d.gpus_total % req.nodes == 0:
                prov[GPN_EXACT] = "--gpus with --nodes"
        elif default_gpus_per_node:
            req.gpus_per_node = min(d.gpus_total, default_gpus_per_node)
            req.nodes = -(-d.gpus_total // default_gpus_per_node)
            prov["request.nodes"] = prov.get("request.gpus", "")
        else:
            req.gpus_per_node = d.gpus_total
            req.nodes = 1
            prov["request.nodes"] = prov.get("request.gpus", "")
        prov["request.gpus_per_node"] = prov.get("request.gpus", "")
    if req.gpus_per_node is None and default_gpus_per_node:
        req.gpus_per_node = default_gpus_per_node
        prov["request.gpus_per_node"] = "platform default"
    if req.gpus_per_node is None and req.ntasks_per_node:
        req.gpus_per_node = req.ntasks_per_node
        prov["request.gpus_per_node"] = prov.get("request.ntasks_per_node", "")
        warnings.append(f"no GPU count in the request and no platform default: assuming one GPU per task "
                        f"(--ntasks-per-node={req.ntasks_per_node})")
    if req.nodes is None and "request.nodes.invalid" not in prov:
        if req.ntasks and req.ntasks_per_node:
            req.nodes = -(-req.ntasks // req.ntasks_per_node)
            prov["request.nodes"] = prov.get("request.ntasks", "")
        elif req.ntasks and req.gpus_per_node and req.ntasks > req.gpus_per_node:
            req.nodes = -(-req.ntasks // req.gpus_per_node)
            prov["request.nodes"] = prov.get("request.ntasks", "")
            warnings.append(f"no --nodes: assuming {req.nodes} node(s) for {req.ntasks} tasks "
                            f"at one task per GPU")
        else:
            req.nodes = 1
            prov["request.nodes"] = "Slurm default"


def slurm_env(req: SlurmRequest, work_dir: Optional[str], array_first: Optional[str]) -> dict[str, str]:
    """The SLURM_* variables a batch step sees, as far as the request fixes them."""
    env: dict[str, str] = {}
    if req.nodes is not None and req.nodes > 0:
        env["SLURM_NNODES"] = env["SLURM_JOB_NUM_NODES"] = str(req.nodes)
    ntasks = req.ntasks
    if ntasks is None and req.nodes and req.ntasks_per_node:
        ntasks = req.nodes * req.ntasks_per_node
    if ntasks is not None:
        env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(ntasks)
    if req.ntasks_per_node is not None:
        env["SLURM_NTASKS_PER_NODE"] = str(req.ntasks_per_node)
    if req.gpus_per_node is not None:
        env["SLURM_GPUS_ON_NODE"] = env["SLURM_GPUS_PER_NODE"] = str(req.gpus_per_node)
    if req.cpus_per_task is not None:
        env["SLURM_CPUS_PER_TASK"] = str(req.cpus_per_task)
    if req.partition:
        env["SLURM_JOB_PARTITION"] = req.partition
    if req.job_name:
        env["SLURM_JOB_NAME"] = req.job_name
    if work_dir:
        env["SLURM_SUBMIT_DIR"] = work_dir
    if array_first is not None:
        env["SLURM_ARRAY_TASK_ID"] = array_first
    # Rank-0 view of per-task variables: the launch line is the same on every rank.
    env.update({"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"})
    return env


def array_first_index(array: Optional[str]) -> Optional[str]:
    if not array:
        return None
    m = _LEADING_INT.match(array)
    return m.group(1) if m else None
