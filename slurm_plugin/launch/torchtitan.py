"""TorchTitan launches -> facts: ``torchrun … -m torchtitan.train --job.config_file X.toml [--section.key V]``.

The TOML names a model (``[model] name`` + ``flavor``); the shapes of the published flavors are in
:data:`FLAVORS`. Command-line overrides (``--training.steps 100``) win over the file. Sections and keys
moved between TorchTitan versions (``[training] batch_size`` became ``local_batch_size``; the
parallel degrees moved from ``[training]`` / ``[experimental]`` to ``[parallelism]``): every spelling
is read, the newest first.

Data parallelism is FSDP2 (``data_parallel_shard_degree``, -1 = the GPUs left over), which shards
parameters, gradients and optimizer state like ZeRO-3, optionally replicated
(``data_parallel_replicate_degree``, HSDP). The predictor accepts ZeRO-3 with pp > 1 for this
framework only (predictor.job).
"""
from __future__ import annotations

import re
from typing import Any, Optional

from . import moe
from .configs import key_origin, to_bool, to_int
from .facts import Facts
from .limits import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, MAX_KEY_SUGGESTIONS, CannotPredict
from .neox_keys import refuse_choice, suggest
from .values import MARK_OPEN, Tok

try:  # Python 3.11+
    import tomllib as _toml
except ImportError:  # pragma: no cover - Python 3.9/3.10
    try:
        import tomli as _toml  # type: ignore[no-redef]
    except ImportError:
        _toml = None  # type: ignore[assignment]

# [activation_checkpoint] mode: ActivationCheckpoint.mode of torchtitan/config/job_config.py
# (Literal["selective", "full", "none"] at 000204a4; "memory_budget" in later releases); apply_ac
# (torchtitan/distributed/activation_checkpoint.py) raises on any other mode, compared as written.
AC_MODES = ("selective", "full", "memory_budget", "none")

# Published flavors' shapes. Source: pytorch/torchtitan, torchtitan/models/llama3/__init__.py
# (llama3_configs: 8B, 70B, 405B) and the earlier torchtitan/models/llama/__init__.py (llama2_configs:
# 7B, 13B, 70B; model name "llama" or "llama2"). ffn = multiple_of-rounded int(m · int(2·4·dim/3)),
# as TorchTitan's FeedForward computes it.
_LLAMA3 = {
    "8B": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.3, multiple_of=1024),
    "70B": dict(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim_multiplier=1.3, multiple_of=4096),
    "405B": dict(dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, ffn_dim_multiplier=1.2, multiple_of=4096),
}
_LLAMA2 = {
    "7B": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_dim_multiplier=None, multiple_of=256),
    "13B": dict(dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, ffn_dim_multiplier=None, multiple_of=256),
    "70B": dict(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim_multiplier=1.3, multiple_of=4096),
}
FLAVORS = {"llama3": (_LLAMA3, 128256), "llama2": (_LLAMA2, 32000), "llama": (_LLAMA2, 32000)}
_MOE_MODELS = re.compile(r"deepseek|llama4|mixtral|moe|qwen3_moe", re.I)

# (section, key) spellings, newest first
_SPELLINGS = {
    "local_batch": [("training", "local_batch_size"), ("training", "batch_size")],
    "global_batch": [("training", "global_batch_size")],
    "seq_len": [("training", "seq_len")],
    "steps": [("training", "steps")],
    "dp_shard": [("parallelism", "data_parallel_shard_degree"), ("training", "data_parallel_shard_degree"),
                 ("training", "data_parallel_degree")],
    "dp_replicate": [("parallelism", "data_parallel_replicate_degree"),
                     ("training", "data_parallel_replicate_degree")],
    "tp": [("parallelism", "tensor_parallel_degree"), ("training", "tensor_parallel_degree")],
    "async_tp": [("parallelism", "enable_async_tensor_parallel"), ("experimental", "enable_async_tensor_parallel")],
    "pp": [("parallelism", "pipeline_parallel_degree"), ("experimental", "pipeline_parallel_degree")],
    "cp": [("parallelism", "context_parallel_degree"), ("experimental", "context_parallel_degree")],
    "pp_micro": [("parallelism", "pipeline_parallel_microbatch_size")],
    "ac_mode": [("activation_checkpoint", "mode")],
    "ac_option": [("activation_checkpoint", "selective_ac_option")],
    "precision": [("training", "mixed_precision_param")],
    "ckpt_enable": [("checkpoint", "enable_checkpoint"), ("checkpoint", "enable")],
    "ckpt_interval": [("checkpoint", "interval")],
    "val_enable": [("validation", "enabled"), ("validation", "enable")],
    "val_freq": [("validation", "freq")],
    "val_steps": [("validation", "steps")],
    "fp8_linear": [("training", "enable_float8_linear"), ("float8", "enable_float8_linear"),
                   ("training", "enable_fp8_linear")],
    "converters": [("model", "converters")],
    "name": [("model", "name")],
    "flavor": [("model", "flavor")],
    "flex": [("model", "use_flex_attn")],
    "attn_type": [("model", "attn_type")],
    "compile": [("compile", "enable"), ("training", "compile")],
    "compile_components": [("compile", "components")],
    "tokenizer": [("model", "tokenizer_path"), ("model", "hf_assets_path")],
}


# TorchTitan's JobConfig fields by section: pytorch/torchtitan torchtitan/config/job_config.py at
# commit 000204a4 (2025), plus the older spellings of _SPELLINGS and a few keys of earlier releases.
_JOB_CONFIG = {
    "job": "config_file dump_folder description use_for_integration_test print_args",
    "profiling": "enable_profiling save_traces_folder profile_freq enable_memory_snapshot save_memory_snapshot_folder",
    "metrics": "log_freq enable_tensorboard disable_color_printing save_tb_folder save_for_all_ranks enable_wandb "
               "rank_0_only",
    "model": "name flavor tokenizer_path converters print_after_conversion hf_assets_path norm_type "
             "use_flex_attn attn_type attn_mask_type",
    "optimizer": "name lr beta1 beta2 eps weight_decay implementation early_step_in_backward fused",
    "lr_scheduler": "warmup_steps decay_ratio decay_type lr_min min_lr_factor",
    "training": "dataset dataset_path local_batch_size batch_size global_batch_size seq_len max_norm steps "
                "enable_cpu_offload mixed_precision_param mixed_precision_reduce compile gc_freq gc_debug seed "
                "deterministic warmup_steps data_parallel_degree data_parallel_shard_degree "
                "data_parallel_replicate_degree tensor_parallel_degree enable_float8_linear enable_fp8_linear "
                "enable_loss_parallel disable_loss_parallel enable_compiled_autograd fsdp_reshard_after_forward",
    "parallelism": "data_parallel_replicate_degree enable_compiled_autograd data_parallel_shard_degree "
                   "fsdp_reshard_after_forward tensor_parallel_degree disable_loss_parallel "
                   "enable_async_tensor_parallel pipeline_parallel_degree pipeline_parallel_split_points "
                   "pipeline_parallel_layers_per_stage pipeline_parallel_schedule pipeline_parallel_schedule_csv "
                   "pipeline_parallel_microbatch_size context_parallel_degree context_parallel_rotate_method "
                   "expert_parallel_degree",
    "checkpoint": "enable_checkpoint enable folder initial_load_path initial_load_model_only interval "
                  "last_save_model_only export_dtype create_seed_checkpoint async_mode keep_latest_k load_step "
                  "exclude_from_loading enable_first_step_checkpoint last_save_in_hf model_weights_only "
                  "interval_type initial_load_model_weights_only last_save_model_weights_only",
    "activation_checkpoint": "mode selective_ac_option per_op_sac_force_recompute_mm_shapes_by_fqns",
    "float8": "enable_fsdp_float8_all_gather precompute_float8_dynamic_scale_for_fsdp "
              "force_recompute_fp8_weight_in_bwd recipe_name filter_fqns emulate moe_fqns_prototype "
              "enable_float8_linear",
    "mx": "mxfp8_dim1_cast_kernel_choice recipe_name filter_fqns",
    "comm": "init_timeout_seconds train_timeout_seconds trace_buf_size save_traces_folder",
    "memory_estimation": "enabled disable_fake_mode",
    "fault_tolerance": "enable process_group process_group_timeout_ms replica_id group_size min_replica_size "
                       "semi_sync_method sync_steps should_quantize fragment_sync_delay fragment_update_alpha",
    "experimental": "custom_import custom_args_module custom_model_path pipeline_parallel_degree "
                    "context_parallel_degree pipeline_parallel_split_points pipeline_parallel_schedule "
                    "enable_async_tensor_parallel",
    "validation": "enabled enable dataset dataset_path local_batch_size seq_len freq steps",
    "compile": "enable components backend",
}
JOB_CONFIG_KEYS = {sect: frozenset(keys.split()) for sect, keys in _JOB_CONFIG.items()}
_READ_KEYS = frozenset(pair for pairs in _SPELLINGS.values() for pair in pairs)


_SECTIONS = frozenset(JOB_CONFIG_KEYS)


def check_keys(t: "Toml", warnings: list) -> None:
    """Every [section] key of the TOML and every ``--section.key`` override against TorchTitan's
    JobConfig. A likely misspelling of a key this reader uses stops the prediction (the job would be
    another one); other unknown keys are warnings. ``experimental.custom_args_module`` extends the
    JobConfig with fields no list holds: then only the likely misspellings are said.

    A misspelt ``[section]`` header of the TOML is said once, at the header's line (its keys would
    all be ignored): it stops the prediction when it holds a key this reader uses."""
    extended = isinstance(t.data.get("experimental"), dict) and t.data["experimental"].get("custom_args_module")
    misspelt = set()
    section_guess: dict = {}    # unknown section -> the section it likely misspells (None: none), once each
    looks = 0        # difflib look-ups, bounded as every reader's (MAX_KEY_SUGGESTIONS)
    for sect, block in t.data.items():
        if isinstance(block, dict) and sect not in JOB_CONFIG_KEYS:
            looks += 1
            guess_sect = section_guess[sect] = suggest(sect, _SECTIONS) if looks <= MAX_KEY_SUGGESTIONS else None
            if guess_sect is not None:
                _misspelt_section(t, sect, guess_sect, block, warnings)
                misspelt.add(sect)
    given = [(sect, key, key_origin(t._origin(sect, key))) for sect, block in t.data.items()
             if isinstance(block, dict) and sect not in misspelt for key in block]
    given += [(sect, key, origin) for (sect, key), (_v, origin) in t.over.items()]
    unsaid = 0
    for sect, key, origin in given:
        known = JOB_CONFIG_KEYS.get(sect)
        if known is not None and key in known:
            continue
        looks += 1
        if looks > MAX_KEY_SUGGESTIONS:
            unsaid += 1
            continue
        if known is None:
            if sect not in section_guess:          # a command-line override's section
                section_guess[sect] = suggest(sect, _SECTIONS)
            guess_sect = section_guess[sect]
            if guess_sect is None:
                if not extended:
                    warnings.append(f"[{sect}] is not a section of TorchTitan's JobConfig; ignored ({origin})")
                continue
            sect_shown, sect = f"[{sect}]", guess_sect
            if key in JOB_CONFIG_KEYS[sect]:
                guess = key
            else:
                guess = suggest(key, JOB_CONFIG_KEYS[sect])
        else:
            sect_shown = f"[{sect}]"
            guess = suggest(key, JOB_CONFIG_KEYS[sect])
        name = f"{sect_shown} {key}"
        if guess is not None and (sect, guess) in _READ_KEYS:
            raise CannotPredict(f"{name} is not a TorchTitan config key; did you mean [{sect}] {guess}? "
                                f"(without it the job would be a different one)", origin)
        if guess is not None:
            warnings.append(f"{name} is not a TorchTitan config key and is ignored; did you mean [{sect}] {guess}? "
                            f"({origin})")
        elif not extended:
            warnings.append(f"{name} is not a TorchTitan config key and is ignored ({origin})")
    if unsaid:
        warnings.append(f"{t.label}: {unsaid} more keys that are not TorchTitan config keys (not looked at)")


def _misspelt_section(t: "Toml", sect: str, guess_sect: str, block: dict, warnings: list) -> None:
    """``[paralelism]``: TorchTitan ignores the section and every key in it. Blamed on the header's
    line (a dotted ``paralelism.key = …`` without a header: on the first key's)."""
    origin = t._header_origin(sect)
    if origin is None:
        first = next(iter(block), None)
        origin = t._origin(sect, first) if isinstance(first, str) else t.label
    known = JOB_CONFIG_KEYS[guess_sect]
    read = []
    for key in block:
        if not isinstance(key, str):
            continue
        meant = key if key in known else suggest(key, known)
        if meant is not None and (guess_sect, meant) in _READ_KEYS:
            read.append(key)
    head = f"[{sect}] is not a section of TorchTitan's JobConfig; did you mean [{guess_sect}]?"
    if read:
        more = f" and {len(read) - 1} more" if len(read) > 1 else ""
        raise CannotPredict(f"{head} (TorchTitan ignores the section, so {read[0]}{more} would not be set: "
                            f"the job would be a different one)", origin)
    warnings.append(f"{head} TorchTitan ignores the section and its keys ({origin})")


def is_torchtitan(module: Optional[str], flags: set) -> bool:
    """``flags``: the script's ``--name`` arguments, each without its ``=value``."""
    if module and module.split(".")[0] == "torchtitan":
        return True
    return not flags.isdisjoint(("--job.config_file", "--job.config-file"))


def read_cli(args: list) -> tuple[Optional[Tok], dict]:
    """(--job.config_file token, {(section, key): (text | True, origin)}) from the script's arguments."""
    cfg: Optional[Tok] = None
    over: dict = {}
    i, n = 0, len(args)
    while i < n:
        t = args[i].text
        m = re.fullmatch(r"--([A-Za-z_]+)\.([A-Za-z0-9_\-]+)(=(.*))?", t, re.S)
        if not m:
            i += 1
            continue
        sect, key = m.group(1), m.group(2).replace("-", "_")
        if m.group(3):
            val, origin = m.group(4), args[i].origin_at(len(t) - len(m.group(4)))
            i += 1
        elif i + 1 < n and not args[i + 1].text.startswith("--"):
            val, origin = args[i + 1].text, args[i + 1].origin_at(0)
            i += 2
        else:
            val, origin = True, args[i].origin_at(0)     # store_true flag (--training.compile)
            i += 1
        if (sect, key) == ("job", "config_file"):
            cfg = Tok(val, [(val, origin)]) if isinstance(val, str) else None
        else:
            over[(sect, key)] = (val, origin)
    return cfg, over


def _line_map(text: str) -> dict:
    """(section, key) -> line, and (section, None) -> its header's line, by a plain scan (tomllib
    keeps no positions); linear in the text."""
    lines: dict = {}
    sect = ""
    for i, ln in enumerate(text.split("\n"), 1):
        s = ln.strip()
        m = re.match(r"\[\s*([A-Za-z0-9_.\-]+)\s*\]", s)
        if m:
            sect = m.group(1)
            lines.setdefault((sect, None), i)       # the [section] header's own line
            continue
        m = re.match(r"([A-Za-z0-9_\-]+)\s*=", s)
        if m:
            lines.setdefault((sect, m.group(1)), i)
    return lines


def _dotted_too_deep(text: str) -> int:
    """The first line whose table header or key has more than MAX_CONFIG_DEPTH dots, or 0: tomllib
    takes time quadratic in a dotted name's parts (a 40 KB header of 20,000 parts: 0.6 s; one of a
    megabyte, minutes).  A dot inside a quoted key counts too: no real config has 64 of them."""
    if text.count(".") <= MAX_CONFIG_DEPTH:
        return 0
    for i, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("["):
            name = line.split("]", 1)[0]
        elif "=" in line:
            name = line.split("=", 1)[0]
        else:
            continue        # a multi-line string's or array's line: no name on it
        if name.count(".") > MAX_CONFIG_DEPTH:
            return i
    return 0


class Toml:
    """The TOML config plus the command-line overrides: value and origin by (section, key)."""

    def __init__(self, text: str, label: str, overrides: dict, line_origins: Optional[list] = None):
        if _toml is None:
            raise CannotPredict("reading TorchTitan's TOML needs Python 3.11 or the tomli package", label)
        if len(text) > MAX_CONFIG_BYTES:
            raise CannotPredict(f"config {label} is larger than {MAX_CONFIG_BYTES >> 10} KiB", f"{label}:1")
        self.label, self.over, self.line_origins = label, overrides, line_origins
        deep = _dotted_too_deep(text)
        if deep:
            raise CannotPredict(f"config {label} is nested more than {MAX_CONFIG_DEPTH} levels deep",
                                self._line_origin(deep))
        try:
            self.data = _toml.loads(text)
        except _toml.TOMLDecodeError as exc:
            m = re.search(r"line (\d+)", str(exc))
            raise CannotPredict(f"{label} is not valid TOML: {str(exc).split('(')[0].strip()[:80]}",
                                f"{label}:{m.group(1) if m else 1}") from None
        except RecursionError:
            raise CannotPredict(f"config {label} is nested too deeply", label) from None
        except ValueError:   # an integer past Python's 4,300-digit conversion limit
            raise CannotPredict(f"config {label} has a number with too many digits", label) from None
        self.lines = _line_map(text)

    def _origin(self, sect: str, key: str) -> str:
        line = self.lines.get((sect, key))
        if line is None:
            return self.label
        return self._line_origin(line)

    def _line_origin(self, line: int) -> str:
        if self.line_origins is not None and 0 < line <= len(self.line_origins):
            return self.line_origins[line - 1]
        return f"{self.label}:{line}"

    def _header_origin(self, sect: str) -> Optional[str]:
        """The ``[sect]`` header's file:line, None when the TOML has no such header."""
        line = self.lines.get((sect, None))
        return None if line is None else self._line_origin(line)

    def find(self, name: str) -> tuple[Any, str, str, bool]:
        """(value, file:line, how the key was written, found): ``--section.key`` for a command-line
        override, ``[section] key`` for the TOML."""
        for sect, key in _SPELLINGS[name]:
            if (sect, key) in self.over:
                val, origin = self.over[(sect, key)]
                return val, origin, f"--{sect}.{key}", True
        for sect, key in _SPELLINGS[name]:
            s = self.data.get(sect)
            if isinstance(s, dict) and key in s:
                return s[key], self._origin(sect, key), f"[{sect}] {key}", True
        return None, "", "", False

    def get(self, name: str) -> tuple[Any, str, bool]:
        val, origin, shown, found = self.find(name)
        return val, _origin_shown(origin, shown), found


def _origin_shown(origin: str, shown: str) -> str:
    """A key's origin as :meth:`Toml.get` gives it: a command-line override's names the flag."""
    return f"{origin} ({shown})" if shown.startswith("--") else origin


def _shown_value(value: Any) -> str:
    return repr(value[:40]) if isinstance(value, str) else repr(value)[:40]


def _checked_int(t: Toml, name: str) -> tuple[Any, str, str, bool]:
    """``t.find(name)`` for an integer key, stopping on a value that is not one: TorchTitan parses a
    command-line value as an int (tyro / argparse refuse another word) and uses a TOML value as
    written, which fails its first comparison or arithmetic at start (ParallelDims asserts each degree
    >= 1, the training loop compares the step with ``training.steps``). A shell value unknown here
    (a marker) is passed on as it is."""
    v, origin, shown, found = t.find(name)
    if found and not (isinstance(v, str) and MARK_OPEN in v):
        if v is True and shown.startswith("--"):      # --section.key with no word after it
            raise CannotPredict(f"TorchTitan stops at start: {shown} has no value (it takes an integer)", origin)
        if isinstance(v, bool) or to_int(v) is None:
            raise CannotPredict(f"TorchTitan stops at start: {shown} is {_shown_value(v)}, not an integer", origin)
    return v, origin, shown, found


def _int_value(t: Toml, name: str) -> tuple[Any, str, bool]:
    """``t.get(name)`` for an integer key, checked (:func:`_checked_int`)."""
    v, origin, shown, found = _checked_int(t, name)
    return v, _origin_shown(origin, shown), found


def _flag(t: Toml, name: str, warnings: list) -> tuple[Optional[bool], str, bool]:
    """(value as a bool, origin, found) of a boolean key. A command-line word that is not true or
    false stops the prediction (TorchTitan's parser refuses it); a TOML value that is neither is used
    by TorchTitan as Python tests it (any non-empty text is true): warned, read as Python reads it."""
    v, origin, shown, found = t.find(name)
    b = to_bool(v)
    if not found or b is not None or (isinstance(v, str) and MARK_OPEN in v):
        return b, _origin_shown(origin, shown), found
    if shown.startswith("--"):
        raise CannotPredict(f"{shown} {_shown_value(v)} is not true or false: TorchTitan's command line refuses "
                            f"it at start", origin)
    b = bool(v)
    warnings.append(f"{shown} is {_shown_value(v)}, not true or false: TorchTitan tests it as Python does, so it "
                    f"is read as {str(b).lower()} ({origin})")
    return b, origin, found


def _int(f: Facts, t: Toml, name: str, fact: str) -> None:
    v, origin, shown, found = _checked_int(t, name)
    if not found:
        return
    f.set_int_value(fact, v, _origin_shown(origin, shown), what=shown)


def ffn_dim(dim: int, multiplier: Optional[float], multiple_of: int) -> int:
    hidden = int(2 * (4 * dim) / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def _recompute(t: Toml, f: Facts) -> None:
    """``[activation_checkpoint] mode`` and ``selective_ac_option`` -> layout.recompute."""
    mode, origin, found = t.get("ac_mode")
    mode = mode if found else "selective"
    if isinstance(mode, str) and MARK_OPEN in mode:
        f.set_unknown("recompute", f.u.reason(mode) or "unknown", origin)
        return
    if mode not in AC_MODES:
        refuse_choice("activation_checkpoint.mode", mode, AC_MODES, "TorchTitan's apply_ac raises "
                      "'Invalid AC mode' and the job stops at start", origin)
    if mode == "memory_budget":
        f.warnings.append(f"activation_checkpoint.mode memory_budget (torch.compile picks what to recompute within "
                          f"the budget) is modelled as op-level selective recomputation ({origin})")
        mode = "selective"
    elif mode == "selective":
        option, o_origin, o_found = t.get("ac_option")
        option = str(option if o_found else "op").strip()
        if MARK_OPEN in option:
            f.set_unknown("recompute", f.u.reason(option) or "unknown", o_origin)
            return
        if not (option == "op" or option.isdigit()):
            # _apply_ac_to_transformer_block: "op" or digits, else ValueError
            refuse_choice("activation_checkpoint.selective_ac_option", option, ("op",), "TorchTitan raises "
                          "'Invalid selective AC option' and the job stops at start", o_origin,
                          "'op' or a positive integer N (one layer in N checkpointed whole)")
        if option.isdigit() and int(option) == 1:
            # Every layer checkpointed whole: full recomputation.
            mode, origin, found = "full", o_origin, True
        elif option != "op":
            f.warnings.append(f"activation_checkpoint.selective_ac_option {option!r} ({o_origin}): one layer in "
                              f"{option} checkpointed whole is costed as op-level selective checkpointing")
    f.set("recompute", mode, origin if found else "TorchTitan default (selective, op-level)")


def read(t: Toml, f: Facts, world: Optional[int], world_origin: str) -> None:
    """Fill facts (framework "torchtitan"); ``world`` = the ranks the launcher starts (None = unknown)."""
    w = f.warnings
    check_keys(t, w)
    name, n_origin, _ = t.get("name")
    flavor, fl_origin, _ = t.get("flavor")
    name_s, flavor_s = str(name or ""), str(flavor or "")
    if _MOE_MODELS.search(name_s) or _MOE_MODELS.search(flavor_s):
        moe.refuse(f"TorchTitan model {name_s} {flavor_s}".strip(), n_origin or fl_origin)
    if name_s not in FLAVORS:
        raise CannotPredict(f"TorchTitan model name {name_s!r} has no shape table here "
                            f"(known: {', '.join(sorted(FLAVORS))})", n_origin or t.label)
    table, vocab = FLAVORS[name_s]
    shape = table.get(flavor_s)
    if shape is None:
        raise CannotPredict(f"TorchTitan {name_s} flavor {flavor_s!r} is not a published one "
                            f"({', '.join(table)}); give the shape in a TOML job file", fl_origin or t.label)
    src = f"{fl_origin} ({name_s} {flavor_s}, TorchTitan's published flavor)"
    f.set("layers", shape["n_layers"], src)
    f.set("hidden", shape["dim"], src)
    f.set("heads", shape["n_heads"], src)
    f.set("kv_heads", shape["n_kv_heads"], src)
    f.set("ffn_hidden", ffn_dim(shape["dim"], shape["ffn_dim_multiplier"], shape["multiple_of"]), src)
    f.set("vocab", vocab, src)
    for k, v in (("norm", "rmsnorm"), ("activation", "swiglu"), ("pos_emb", "rotary"),
                 ("tied_embeddings", False), ("parallel_residual", False)):
        f.set(k, v, f"TorchTitan {name_s}")
    # PyTorch SDPA picks the flash kernel for bf16 causal attention; FlexAttention (use_flex_attn,
    # attn_type "flex") is a Triton kernel torch.compile generates
    f.set("attention", "flash", "TorchTitan (scaled_dot_product_attention)")
    flex, fx_origin, _ = _flag(t, "flex", w)
    kind, k_origin, _ = t.get("attn_type")
    if flex or str(kind or "").lower() == "flex":
        f.set("attention_impl", "triton", fx_origin if flex else k_origin)
    elif str(kind or "").lower() == "sdpa":
        f.set("attention_impl", "sdpa_flash", k_origin)
    _int(f, t, "seq_len", "seq_len")
    _int(f, t, "steps", "train_iters")
    for name_, fact in (("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("dp_shard", "dp_shard"),
                        ("dp_replicate", "dp_replicate"), ("local_batch", "tt_local"),
                        ("global_batch", "global_batch"), ("pp_micro", "tt_pp_micro")):
        _int(f, t, name_, fact)
    for k, default in (("tp", 1), ("pp", 1), ("cp", 1), ("dp_replicate", 1), ("dp_shard", -1), ("tt_pp_micro", 1)):
        if f.get(k) is None:
            f.set(k, default, "TorchTitan default")
    if f.known("global_batch") and f.val("global_batch") < 0:
        del f.d["global_batch"]          # -1 = local batch × dp
    _degrees(f, world, world_origin)
    # TorchTitan's tensor-parallel plan shards norms/dropout over the sequence (SequenceParallel)
    if f.known("tp"):
        f.set("sequence_parallel", f.val("tp") > 1, f.origin("tp"))
    # batch: one pipeline microbatch per step unless pp splits the local batch
    if f.known("tt_local"):
        local = f.val("tt_local")
        if f.known("pp") and f.val("pp") > 1 and f.known("tt_pp_micro"):
            mb = f.val("tt_pp_micro")
            if local % mb:
                raise CannotPredict(f"local batch {local} is not divisible by pipeline_parallel_microbatch_size "
                                    f"{mb}", f.origin("tt_pp_micro"))
            f.set("micro_batch", mb, f.origin("tt_pp_micro"))
        else:
            f.set("micro_batch", local, f.origin("tt_local"))
        if f.get("global_batch") is None and f.known("dp_shard") and f.val("dp_shard") > 0:
            dp = f.val("dp_shard") * f.val("dp_replicate", 1)
            f.set("global_batch", local * dp, f.origin("tt_local"))
    elif f.get("tt_local") is None:
        raise CannotPredict("[training] local_batch_size (or batch_size) not found", t.label)
    else:
        fl = f.get("tt_local")
        f.set_unknown("micro_batch", fl.unknown or "unknown", fl.origin)
    # ZeRO: FSDP shards when the shard degree is > 1; DDP (replicate only) keeps full copies
    shard = f.val("dp_shard")
    f.set("zero_stage", 3 if shard and shard > 1 else 0, f.origin("dp_shard"))
    async_tp, a_origin, found = _flag(t, "async_tp", w)
    if found and async_tp and f.known("tp") and f.val("tp") > 1:
        # Micro-pipelined all-gather / reduce-scatter matmuls (torch.compile's SymmetricMemory
        # passes): no measurement of their overlap here, so the TP collectives stay exposed.
        w.append(f"enable_async_tensor_parallel is not modelled: TP communication is costed as not "
                 f"overlapped with the matmuls (an upper bound on the step) ({a_origin})")
    _recompute(t, f)
    prec, origin, found = t.get("precision")
    prec = str(prec or "bfloat16").lower()
    f.set("precision", "fp32" if prec in ("float32", "fp32") else "bf16",
          origin if found else "TorchTitan default (mixed_precision_param bfloat16)")
    comp, origin, found = _flag(t, "compile", w)
    if found:
        parts, p_origin, p_found = t.get("compile_components")
        # Newer TorchTitan compiles the listed components ("model", "loss"); the layers only when
        # "model" is one of them.
        model_compiled = bool(comp) and (not p_found or "model" in str(parts))
        f.set("compile", model_compiled, p_origin if p_found and not model_compiled else origin)
    fp8, origin, _ = _flag(t, "fp8_linear", w)
    conv, c_origin, _ = t.get("converters")
    if fp8 or (isinstance(conv, (list, str)) and "float8" in str(conv)):
        # torchao's float8 linears: every recipe (tensorwise, rowwise) scales dynamically, from
        # the tensor itself.
        f.set("fp8_recipe", "current", origin or c_origin)
    en, origin, found = _flag(t, "ckpt_enable", w)
    if en:
        iv, i_origin, i_found = _int_value(t, "ckpt_interval")
        n = to_int(iv) if i_found else 500
        f.set("save_interval", n if n is not None else 0, i_origin if i_found else "TorchTitan default (500)")
    else:
        f.set("save_interval", 0, origin or "TorchTitan default (no checkpoints)")
    en, origin, found = _flag(t, "val_enable", w)
    if en:
        freq, fr_origin, _ = _int_value(t, "val_freq")
        steps, st_origin, _ = _int_value(t, "val_steps")
        fq, st = to_int(freq), to_int(steps)
        if fq and st and st > 0:
            f.set("eval_interval", fq, fr_origin)
            f.set("eval_iters", st, st_origin)
        else:
            w.append(f"validation is enabled but its frequency/steps are not both set ({origin}); not modelled")
            f.set("eval_interval", 0, origin)
            f.set("eval_iters", 0, origin)
    else:
        f.set("eval_interval", 0, origin or "TorchTitan default (no validation)")
        f.set("eval_iters", 0, origin or "TorchTitan default (no validation)")
    f.set("pipe_split", "megatron", "TorchTitan (layers split evenly over the stages)")


_DEGREE_NAMES = {"dp_replicate": "data_parallel_replicate_degree", "tp": "tensor_parallel_degree",
                 "pp": "pipeline_parallel_degree", "cp": "context_parallel_degree"}


def _degrees(f: Facts, world: Optional[int], world_origin: str) -> None:
    """Resolve data_parallel_shard_degree -1 and check the product against the world, as TorchTitan does."""
    names = ("dp_replicate", "tp", "pp", "cp")
    if f.get("dp_shard") is None or not f.known("dp_shard"):
        return
    if not all(f.known(k) for k in names):
        if f.val("dp_shard") < 0:
            # -1 = the GPUs left over: not known while another degree is not
            unknown = next(k for k in names if not f.known(k))
            f.set_unknown("dp_shard", f"data_parallel_shard_degree -1 and {_DEGREE_NAMES[unknown]} unknown",
                          f.origin("dp_shard"))
        return
    rest = 1
    for k in names:
        if f.val(k) < 1:
            # (ParallelDims asserts each degree >= 1; only the shard degree may be -1)
            raise CannotPredict(f"{_DEGREE_NAMES[k]} {f.val(k)} must be at least 1 (TorchTitan stops at start-up)",
                                f.origin(k))
        rest *= f.val(k)
    shard = f.val("dp_shard")
    if shard == 0 or shard < -1:
        raise CannotPredict(f"data_parallel_shard_degree {shard} must be -1 or at least 1 (TorchTitan stops at "
                            f"start-up)", f.origin("dp_shard"))
    if world is None:
        if shard < 0:
            f.set_unknown("dp_shard", "data_parallel_shard_degree -1 and the number of GPUs unknown",
                          f.origin("dp_shard"))
        return
    if shard < 0:
        if world % rest:
            raise CannotPredict(f"{world} GPUs are not divisible by replicate×tp×pp×cp = {rest}", world_origin)
        f.set("dp_shard", world // rest, f"{f.origin('dp_shard')} (-1: the GPUs left over)")
    elif shard * rest != world:
        raise CannotPredict(f"data_parallel_shard_degree {shard} × replicate×tp×pp×cp {rest} ≠ {world} GPUs "
                            f"(TorchTitan stops at start-up)", f.origin("dp_shard"))
