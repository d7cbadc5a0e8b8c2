"""The training job: what is trained (model), how it is split (layout), how long (run), where (cluster).

Like Calculon's application / execution / system split, each part is a small named object; a
:class:`TrainingJob` is built from the TOML job file or a dict with the keys of docs/job-file.md
and is validated on construction, with errors that name the key at fault.

How the layers are split over pipeline stages is part of the layout (the rules themselves are in
:mod:`predictor.recipe`)::

    [layout]
    pipe_split = "neox"          # the framework's rule: neox | deepspeed_parameters |
                                 #   deepspeed_uniform | megatron
    stage_layers = [10, 12, 12, 10]   # optional explicit split, pp × virtual_stages entries in
                                 #   pipeline order (overrides pipe_split for this pp and v)
    first_stage_layers = 0       # megatron only: --decoder-first-pipeline-num-layers (0 = not set)
    last_stage_layers = 0        # megatron only: --decoder-last-pipeline-num-layers (0 = not set)
    account_for_embedding = false   # megatron only: --account-for-embedding-in-pipeline-split
    account_for_loss = false        # megatron only: --account-for-loss-in-pipeline-split

* ``neox`` (default): GPT-NeoX's default ``pipe_partition_method: "type:transformer|mlp"``;
* ``deepspeed_parameters`` / ``deepspeed_uniform``: GPT-NeoX with ``pipe_partition_method``
  ``"parameters"`` / ``"uniform"`` (DeepSpeed's PipelineModule methods over NeoX's layer list);
* ``megatron``: Megatron-LM / NeMo, layers split evenly (pp must divide them) unless the
  first/last stage is fixed; the embedding / loss may count as one layer of the first / last stage.
"""
from __future__ import annotations

import dataclasses
import math
import operator
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from .checkpointing import MEGATRON_CORE_FRAMEWORKS, options_set
from .errors import JobError, did_you_mean
# (predictor.checkpointing imports the recipe already; the recipe never imports this module)
from .recipe import pipeline_split
# The job's parts and key names, re-exported: predictor.job is where callers find them.
from .specs import (ACTIVATIONS, ATTENTION_IMPLS, ATTENTIONS, DEEPSPEED_PIPELINE_FRAMEWORKS,  # noqa: F401
                    EVEN_SPLIT_FRAMEWORKS, FP8_RECIPES, FRAMEWORKS, FSDP1_FRAMEWORKS, FSDP2_FRAMEWORKS,
                    GRAD_PRECISIONS, NORMS, PIPE_SPLITS,
                    POS_EMBS, PRECISIONS, RECOMPUTES, RESHARD_POLICIES, ClusterSpec, Layout, ModelSpec,
                    RunSpec, runs_deepspeed_engine)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on older Pythons only
    import tomli as tomllib

# Bounds that no real LLM job comes near; past them the input is a typo or an attack, and the
# arithmetic downstream (memory, FLOPs) would only produce nonsense.
_MAX = {
    "layers": 10_000, "hidden": 1 << 20, "heads": 1 << 14, "kv_heads": 1 << 14,
    "ffn_hidden": 1 << 22, "seq_len": 1 << 24, "vocab": 1 << 24, "attention_window": 1 << 24,
    "pp": 4096, "tp": 4096, "dp": 1 << 20, "dp_shard": 1 << 20, "cp": 4096, "micro_batch": 1 << 16, "micro_batches": 1 << 20,
    "virtual_stages": 1024, "train_iters": 1 << 40, "eval_interval": 1 << 40,
    "eval_iters": 1 << 30, "save_interval": 1 << 40, "gpus_per_node": 1024,
    "train_samples": 1 << 50, "train_tokens": 1 << 62,
    "first_stage_layers": 10_000, "last_stage_layers": 10_000, "stage_layers": 10_000,
}
# Entries of an explicit split: pp × virtual_stages at most.
_MAX_SPLIT_ENTRIES = _MAX["pp"] * _MAX["virtual_stages"]


_SECTIONS: dict[str, type] = {"model": ModelSpec, "layout": Layout, "run": RunSpec, "cluster": ClusterSpec}
_CHOICES = {
    "model.norm": NORMS, "model.activation": ACTIVATIONS, "model.attention": ATTENTIONS,
    "model.attention_impl": ATTENTION_IMPLS,
    "model.pos_emb": POS_EMBS, "layout.recompute": RECOMPUTES, "run.precision": PRECISIONS,
    "layout.pipe_split": PIPE_SPLITS, "run.framework": FRAMEWORKS, "run.fp8": FP8_RECIPES,
    "run.grad_reduce_precision": GRAD_PRECISIONS, "layout.reshard_after_forward": RESHARD_POLICIES,
}
_REQUIRED = {"model.layers", "model.hidden", "model.heads", "model.seq_len"}


def _field_types(cls: type) -> dict[str, Any]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _kind(f: dataclasses.Field) -> str:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    # A key whose default is "decided by another key" (model.linear_bias: None = by the norm)
    # is given in a job file as its plain type.
    return kind[len("Optional["):-1] if kind.startswith("Optional[") else kind


# Read once, not per job (the daemon builds a job per new shape): per section, each key's type
# name; the required keys in the order of the section's fields (the first missing one is named,
# the same in every process: a set's order of strings changes with the hash seed).
_KINDS: dict[str, dict[str, str]] = {
    section: {name: _kind(f) for name, f in _field_types(cls).items()} for section, cls in _SECTIONS.items()}
_REQUIRED_BY_SECTION: dict[str, tuple[tuple[str, str], ...]] = {
    section: tuple((f"{section}.{name}", name) for name in kinds if f"{section}.{name}" in _REQUIRED)
    for section, kinds in _KINDS.items()}
# Per section: its keys, a getter of their values, and the keys that hold tuples (lists in a job file).
_TO_DICT = tuple((section, tuple(kinds), operator.attrgetter(*kinds),
                  tuple(k for k, kind in kinds.items() if kind.startswith("tuple")))
                 for section, kinds in _KINDS.items())
# Per section, for the checks that need no _coerce: each int key's bound, the bool keys, each
# string key's choices (None: any string).
_FAST: dict[str, tuple[dict[str, float], frozenset[str], dict[str, Optional[tuple[str, ...]]]]] = {
    section: ({k: _MAX.get(k, math.inf) for k, kind in kinds.items() if kind == "int"},
              frozenset(k for k, kind in kinds.items() if kind == "bool"),
              {k: _CHOICES.get(f"{section}.{k}") for k, kind in kinds.items() if kind == "str"})
    for section, kinds in _KINDS.items()}


@dataclass(frozen=True)
class TrainingJob:
    """A whole training job: model, layout, run and cluster, validated on construction.

    Build one with :meth:`from_dict` or :meth:`from_toml`; :meth:`to_dict` gives back the keys of
    docs/job-file.md with every default filled in (the ``job`` of the JSON answer).
    """

    model: ModelSpec
    layout: Layout = field(default_factory=Layout)
    run: RunSpec = field(default_factory=RunSpec)
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        _validate(self)

    # ----------------------------------------------------------------------------- building
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "") -> "TrainingJob":
        """Build from ``{"model": {...}, "layout": {...}, "run": {...}, "cluster": {...}}``.

        Unknown sections or keys, wrong types and missing required keys raise :class:`JobError`
        naming the dotted key (with a did-you-mean where one is close).
        """
        if type(data) is not dict and not isinstance(data, Mapping):    # (an ABC check is slow)
            raise JobError("", "a job must be a table of sections [model], [layout], [run], [cluster]", source)
        kwargs: dict[str, dict[str, Any]] = {}
        for section, value in data.items():
            if section not in _SECTIONS:
                raise JobError(str(section), "unknown section" + did_you_mean(str(section), _SECTIONS), source)
            if type(value) is not dict and not isinstance(value, Mapping):
                raise JobError(section, "must be a table of keys", source)
            kwargs[section] = _section_kwargs(section, value, source)
        if "model" not in kwargs:
            missing = sorted(_REQUIRED)
            raise JobError(missing[0], "required key is missing (the [model] section is absent)", source)
        run = kwargs.get("run")
        if (run is not None and run.get("framework", "") in EVEN_SPLIT_FRAMEWORKS
                and "pipe_split" not in data.get("layout", {})):
            # A job that names a Megatron-core framework and no split rule gets that framework's
            # rule, as a launch read from its command line would; "neox" is the default otherwise.
            kwargs.setdefault("layout", {})["pipe_split"] = "megatron"
        model = kwargs["model"]
        for key, default in (("kv_heads", "heads"), ("ffn_hidden", "4 × hidden")):
            # 0 is the spec's own "not given" (ModelSpec); written out, it is a mistake.
            if model.get(key) == 0:
                raise JobError(f"model.{key}", f"must be at least 1 (leave it out for the default, "
                               f"{default})", source)
        if model.get("attention_impl") and "attention" not in data["model"]:
            # Naming an attention kernel says the attention is fused: a job file (or a launch
            # reader) that gives only the kernel needs no model.attention = "flash" beside it.
            model["attention"] = "flash"
        # Each section built once, from its checked keys (any key a rule above set included).
        parts = {section: _SECTIONS[section](**kw) for section, kw in kwargs.items()}
        try:
            return cls(source=source, **parts)
        except JobError as exc:
            if source and not exc.source:
                raise JobError(exc.key, str(exc).split(": ", 1)[-1], source) from None
            raise

    @classmethod
    def from_toml(cls, path: "str | Path") -> "TrainingJob":
        """Read a TOML job file; syntax errors name the file, line and column."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise JobError("", f"cannot read job file: {exc.strerror or exc}", str(p)) from None
        except UnicodeDecodeError:
            raise JobError("", "job file is not UTF-8 text", str(p)) from None
        if text.startswith("\ufeff"):
            # Windows editors write it; tomllib then reports only "Invalid statement" at 1:1.
            raise JobError("", "starts with a byte-order mark, which TOML does not allow: save the "
                           "file as UTF-8 without BOM", str(p))
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise JobError("", f"not valid TOML: {exc}", str(p)) from None
        _check_run_length(data, str(p))
        return cls.from_dict(data, source=str(p))

    def replace(self, **sections: Mapping[str, Any]) -> "TrainingJob":
        """A copy with some keys changed, e.g. ``job.replace(layout={"pp": 8})``; re-validated."""
        d = self.to_dict()
        for section, values in sections.items():
            d.setdefault(section, {}).update(values)
        return TrainingJob.from_dict(d, source=self.source)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The resolved job in the job-file keys (every default filled in).

        Lists come out as lists (``layout.stage_layers``), as a TOML or JSON reader gives them back.
        """
        # The sections hold scalars and tuples of numbers only: read field by field (what
        # dataclasses.asdict gives, without its deep copies; the daemon does this per job).
        out: dict[str, dict[str, Any]] = {}
        for name, keys, values_of, tuple_keys in _TO_DICT:
            section = out[name] = dict(zip(keys, values_of(getattr(self, name))))
            for key in tuple_keys:
                section[key] = list(section[key])
        return out

    # ----------------------------------------------------------------------------- derived
    @property
    def gpus(self) -> int:
        return self.layout.gpus

    def nodes(self, gpus_per_node: int) -> int:
        return max(1, math.ceil(self.gpus / gpus_per_node))

    @property
    def tokens_per_iteration(self) -> int:
        return self.layout.global_batch * self.model.seq_len

    @property
    def iterations(self) -> int:
        """Optimizer steps: train_iters, else derived from train_samples or train_tokens."""
        r = self.run
        if r.train_iters:
            return r.train_iters
        if r.train_samples:
            return math.ceil(r.train_samples / self.layout.global_batch)
        if r.train_tokens:
            return math.ceil(r.train_tokens / self.tokens_per_iteration)
        return 0


_RUN_LENGTH = ("train_iters", "train_samples", "train_tokens")


def _check_run_length(data: Mapping[str, Any], source: str) -> None:
    """A job file says how long it trains in one way: two of train_iters, train_samples and
    train_tokens would leave one silently unused (Megatron refuses both too), and a written 0 is no
    length (leave the key out when the length is not known)."""
    run = data.get("run")
    if not isinstance(run, Mapping):
        return
    given = [k for k in _RUN_LENGTH if k in run]
    if len(given) > 1:
        raise JobError(f"run.{given[1]}", f"give one of run.{', run.'.join(_RUN_LENGTH)}, not "
                       f"run.{given[0]} and run.{given[1]} together (the first would be used, the other ignored)",
                       source)
    for k in given:
        if type(run[k]) is int and run[k] == 0:
            raise JobError(f"run.{k}", "must be at least 1 (leave it out when the length is not known: "
                           "the total is then unknown)", source)


def _section_kwargs(section: str, values: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The section's keys, checked and coerced (the arguments of its dataclass)."""
    int_limit, bool_keys, str_choices = _FAST[section]
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        # The common cases, as _coerce would accept them unchanged: a plain int within its bound,
        # a bool, a string that is already one of its choices (they are stripped and lower case).
        vtype = type(value)
        if vtype is int:
            if 0 <= value <= int_limit.get(key, -1):
                kwargs[key] = value
                continue
        elif vtype is bool:
            if key in bool_keys:
                kwargs[key] = value
                continue
        elif vtype is str:
            choices = str_choices.get(key, ())
            if choices is None or value in choices:
                kwargs[key] = value
                continue
        kind = _KINDS[section].get(key)
        if kind is None:
            raise JobError(f"{section}.{key}", "unknown key" + did_you_mean(str(key), _KINDS[section]), source)
        kwargs[key] = _coerce(f"{section}.{key}", key, kind, value, source)
    for req, key in _REQUIRED_BY_SECTION[section]:
        if key not in kwargs:
            raise JobError(req, "required key is missing", source)
    return kwargs


def _coerce(dotted: str, key: str, kind: str, value: Any, source: str) -> Any:
    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise JobError(dotted, f"must be true or false, got {value!r}", source)
    if kind == "int":
        # 4.0 from a YAML/JSON config is an int in disguise; 4.5 is not.
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise JobError(dotted, f"must be an integer, got {value!r}", source)
        if isinstance(value, float):
            if not math.isfinite(value) or value != int(value):
                raise JobError(dotted, f"must be an integer, got {value!r}", source)
            value = int(value)
        if value < 0:
            raise JobError(dotted, f"must not be negative, got {value}", source)
        limit = _MAX.get(key)
        if limit is not None and value > limit:
            raise JobError(dotted, f"{value} is beyond any sane size (at most {limit})", source)
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise JobError(dotted, f"must be a string, got {value!r}", source)
        choices = _CHOICES.get(dotted)
        if choices is not None:
            v = value.strip().lower()
            if v not in choices:
                raise JobError(dotted, f"{value!r} is not one of {', '.join(c or repr(c) for c in choices)}"
                               + did_you_mean(v, choices), source)
            return v
        return value
    if kind.startswith("tuple[int"):
        # A list of integers (a TOML array); each entry as strict as an int key.
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
            raise JobError(dotted, f"must be a list of integers, got {value!r}", source)
        if len(value) > _MAX_SPLIT_ENTRIES:
            raise JobError(dotted, f"has {len(value)} entries, beyond any sane pipeline", source)
        limit = _MAX.get(key, 0)
        out = []
        for i, v in enumerate(value):
            if isinstance(v, bool) or not isinstance(v, (int, float)) \
                    or (isinstance(v, float) and (not math.isfinite(v) or v != int(v))):
                raise JobError(dotted, f"entry {i} must be an integer, got {v!r}", source)
            if not 0 <= v <= limit:
                raise JobError(dotted, f"entry {i} = {int(v)} is not a layer count", source)
            out.append(int(v))
        return tuple(out)
    raise AssertionError(f"unhandled field type {kind} for {dotted}")  # a bug in this module


def check_layout(m: ModelSpec, lay: Layout, framework: str = "") -> None:
    """Raise :class:`JobError` naming the key when the framework could not run ``lay`` for ``m``.

    The one statement of which layouts launch: job files are validated with it and perf-advise
    enumerates only layouts it accepts.
    """
    if m.hidden % m.heads:
        raise JobError("model.heads", f"hidden ({m.hidden}) must be divisible by heads ({m.heads})")
    if m.kv_heads > m.heads or m.heads % m.kv_heads:
        raise JobError("model.kv_heads", f"heads ({m.heads}) must be a multiple of kv_heads ({m.kv_heads})")
    if m.heads % lay.tp:
        raise JobError("layout.tp", f"heads ({m.heads}) must be divisible by tp ({lay.tp})")
    if m.kv_heads % lay.tp:
        raise JobError("layout.tp", f"kv_heads ({m.kv_heads}) must be divisible by tp ({lay.tp})")
    if m.ffn_hidden % lay.tp:
        raise JobError("layout.tp", f"ffn_hidden ({m.ffn_hidden}) must be divisible by tp ({lay.tp})")
    if framework == "llm-foundry":
        # Composer trains with FSDP (and tensor parallelism through tp_config): no pipeline, no
        # context parallelism.
        for key, value in (("layout.pp", lay.pp), ("layout.cp", lay.cp)):
            if value > 1:
                raise JobError(key, f"llm-foundry (Composer + FSDP) has no {key.split('.')[1]} > 1 (got {value})")
    chunks = lay.pp * lay.virtual_stages
    if m.layers < chunks:
        raise JobError("layout.pp", f"{m.layers} layers cannot fill pp × virtual_stages = {chunks} stages")
    if lay.virtual_stages > 1 and lay.pp < 2:
        raise JobError("layout.virtual_stages", "interleaved stages need pp of at least 2")
    # The split over pipeline stages: the framework's rule may refuse this pp (Megatron's even
    # split, the interleaved schedule's layers per chunk, an explicit split of the wrong length);
    # the recipe names the key at fault.
    pipeline_split(m, lay)
    if lay.virtual_stages > 1:
        if lay.micro_batches % lay.pp:
            raise JobError("layout.micro_batches",
                           f"the interleaved schedule needs micro_batches ({lay.micro_batches}) "
                           f"divisible by pp ({lay.pp})")
    if not 0 <= lay.zero_stage <= 3:
        raise JobError("layout.zero_stage", f"must be 0, 1, 2 or 3, got {lay.zero_stage}")
    if lay.zero_stage >= 2 and lay.pp > 1 and framework != "torchtitan":
        raise JobError("layout.zero_stage",
                       f"ZeRO stage {lay.zero_stage} cannot be combined with pipeline parallelism (pp={lay.pp}); "
                       "DeepSpeed supports only stages 0 and 1 with pp > 1 (TorchTitan's FSDP2 does: "
                  "run.framework = \"torchtitan\")")
    if m.attention_impl and m.attention != "flash":
        raise JobError("model.attention_impl",
                       f"names the kernel of fused attention ({m.attention_impl!r}); model.attention is "
                       f"{m.attention!r}, not \"flash\" (leave attention_impl empty, or set attention = \"flash\")")
    if lay.dp_shard or lay.reshard_after_forward != "default":
        _check_fsdp(lay, framework)
    if lay.overlap_grad_reduce or lay.overlap_param_gather:
        _check_overlaps(lay, framework)
    if lay.tp_comm_overlap:
        _check_tp_overlap(m, lay, framework)
    on = options_set(lay)
    if on:
        _check_ds_checkpointing(on, framework)
    if lay.cp > 1:
        # Megatron splits each sequence into 2·cp chunks (load-balanced causal attention).
        if m.seq_len % (2 * lay.cp):
            raise JobError("layout.cp", f"seq_len ({m.seq_len}) must be divisible by 2 × cp ({2 * lay.cp})")
        if m.attention_impl == "math":
            raise JobError("layout.cp", "context parallelism runs ring attention on flash-attention "
                                        "kernels, not SDPA's math fallback (model.attention_impl)")
        if m.attention != "flash":
            raise JobError("layout.cp", "context parallelism runs ring attention on flash-attention "
                                        "kernels: model.attention must be \"flash\"")


def _check_fsdp(lay: Layout, framework: str) -> None:
    """Hybrid sharding is FSDP's ZeRO-3 (FULL_SHARD / HYBRID_SHARD) and ZeRO-2 (Composer's
    _HYBRID_SHARD_ZERO2, TorchTitan's never-resharding mesh); the reshard policy is ZeRO-3's."""
    fsdp = FSDP1_FRAMEWORKS + FSDP2_FRAMEWORKS
    if lay.dp_shard and lay.zero_stage != 3 and not (lay.zero_stage == 2 and framework in fsdp):
        under = f" under {framework!r}" if framework else ""
        raise JobError("layout.dp_shard", f"shapes FSDP's parameter sharding: needs layout.zero_stage = 3 "
                                          f"(or 2 under {' or '.join(fsdp)}), not {lay.zero_stage}{under}")
    if lay.reshard_after_forward != "default" and lay.zero_stage != 3:
        raise JobError("layout.reshard_after_forward", f"shapes ZeRO-3's parameter sharding (FSDP): needs "
                                                       f"layout.zero_stage = 3, not {lay.zero_stage}")
    if lay.dp_shard and (lay.dp_shard > lay.dp or lay.dp % lay.dp_shard):
        raise JobError("layout.dp_shard", f"shards each parameter over dp_shard of the dp = {lay.dp} "
                                          f"data-parallel ranks: must divide dp, got {lay.dp_shard}")


def _check_overlaps(lay: Layout, framework: str) -> None:
    """Megatron-core's overlapped data-parallel communication, where it exists."""
    key = "layout.overlap_grad_reduce" if lay.overlap_grad_reduce else "layout.overlap_param_gather"
    if runs_deepspeed_engine(lay, framework):
        raise JobError(key, "is Megatron-core's (run.framework \"megatron\" or \"nemo\"); DeepSpeed's "
                            "engine reduces gradients after the last micro-batch (at ZeRO-2 after each)")
    if lay.zero_stage >= 2:
        raise JobError(key, f"Megatron-core's DDP has no ZeRO stage {lay.zero_stage} (0: all-reduce, "
                            "1: distributed optimizer)")
    if lay.overlap_param_gather:
        if lay.zero_stage != 1:
            raise JobError("layout.overlap_param_gather", "gathers the distributed optimizer's shards: "
                                                          "needs layout.zero_stage = 1")
        if not lay.overlap_grad_reduce:
            raise JobError("layout.overlap_param_gather", "needs layout.overlap_grad_reduce = true "
                                                          "(as Megatron-LM requires)")


def _check_tp_overlap(m: ModelSpec, lay: Layout, framework: str) -> None:
    """Transformer Engine's tensor-parallel overlap, where Megatron-core runs it (with tp = 1
    there is nothing to overlap, and the key does nothing)."""
    key = "layout.tp_comm_overlap"
    if runs_deepspeed_engine(lay, framework) or framework == "torchtitan":
        raise JobError(key, "is Transformer Engine's under Megatron-core (run.framework \"megatron\" or "
                            "\"nemo\"); DeepSpeed's engine and TorchTitan have no such overlap")
    if m.parallel_residual:
        raise JobError(key, "overlaps the collectives of Megatron-core's sequential layer; a parallel "
                            "residual (model.parallel_residual) has other ones")
    if lay.tp > 1 and not lay.sequence_parallel:
        raise JobError(key, "overlaps sequence parallelism's all-gathers and reduce-scatters: needs "
                            "layout.sequence_parallel = true (as Megatron-LM requires)")


def _check_ds_checkpointing(on: tuple[str, ...], framework: str) -> None:
    """DeepSpeed's activation-checkpointing options exist where DeepSpeed's checkpoint function
    wraps the layers (GPT-NeoX, DeepSpeed, Megatron-DeepSpeed, or a job that names no framework);
    Megatron-LM's own function has the partitioning (--distribute-saved-activations).  Where they
    act on nothing (no recomputation; Megatron-core's selective recomputation or sequence
    parallelism) the answer says so: not an error, since perf-advise tries a job's layout with other
    recomputation too."""
    if not framework or framework in DEEPSPEED_PIPELINE_FRAMEWORKS:
        return
    allowed = ("partition_activations",) if framework in MEGATRON_CORE_FRAMEWORKS else ()
    for key in on:
        if key not in allowed:
            raise JobError(f"layout.{key}", f"is an option of DeepSpeed's activation checkpointing (run.framework "
                                            f"{', '.join(repr(f) for f in DEEPSPEED_PIPELINE_FRAMEWORKS)}"
                                            f"{'; Megatron-LM has partition_activations only' if allowed else ''}); "
                                            f"{framework} checkpoints its layers with its own function")


# The keys that must be at least 1, in the order they are checked (the first is named).
_POSITIVE_MODEL_KEYS = ("layers", "hidden", "heads", "seq_len", "vocab", "kv_heads", "ffn_hidden")
_POSITIVE_LAYOUT_KEYS = ("pp", "tp", "dp", "cp", "micro_batch", "micro_batches", "virtual_stages")
_POSITIVE_MODEL = operator.attrgetter(*_POSITIVE_MODEL_KEYS)
_POSITIVE_LAYOUT = operator.attrgetter(*_POSITIVE_LAYOUT_KEYS)


def _validate(job: TrainingJob) -> None:
    m, lay, run, src = job.model, job.layout, job.run, job.source

    def err(key: str, msg: str) -> JobError:
        return JobError(key, msg, src)

    if min(_POSITIVE_MODEL(m)) < 1:
        for key in _POSITIVE_MODEL_KEYS:
            if getattr(m, key) < 1:
                raise err(f"model.{key}", "must be at least 1")
    if min(_POSITIVE_LAYOUT(lay)) < 1:
        for key in _POSITIVE_LAYOUT_KEYS:
            if getattr(lay, key) < 1:
                raise err(f"layout.{key}", "must be at least 1")
    try:
        check_layout(m, lay, run.framework)
    except JobError as exc:
        raise err(exc.key, exc.reason) from None
    if run.eval_interval and not run.eval_iters:
        raise err("run.eval_iters", "eval_interval is set but eval_iters is 0")
    if run.fp8 and run.precision == "fp32":
        # FP8 training keeps everything but the GEMMs in 16 bits (Transformer Engine, torchao).
        raise err("run.fp8", "FP8 GEMMs need run.precision bf16 or fp16, not fp32")
    if job.cluster.gpus_per_node and lay.gpus > job.cluster.gpus_per_node \
            and lay.gpus % job.cluster.gpus_per_node:
        raise err("cluster.gpus_per_node",
                  f"pp×tp×cp×dp = {lay.gpus} GPUs do not fill whole nodes of {job.cluster.gpus_per_node}")


def load_job(path: "str | Path", overrides: Optional[Mapping[str, Mapping[str, Any]]] = None) -> TrainingJob:
    """Read a TOML job file, optionally overriding some keys (used by the CLIs)."""
    job = TrainingJob.from_toml(path)
    return job.replace(**overrides) if overrides else job
