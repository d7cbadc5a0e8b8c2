"""NeMo 1.x (Hydra) launches -> facts: ``megatron_gpt_pretraining.py --config-path=DIR --config-name=NAME k=v``.

The base config is DIR/NAME.yaml (DIR relative to the training script, as Hydra resolves a relative
``--config-path``; without one the script's own ``conf/megatron_gpt_config.yaml``). Command-line
overrides win: ``key=value`` sets an existing key, ``+key=value`` adds one, ``++key=value`` sets or
adds, ``~key`` deletes. OmegaConf interpolations ``${a.b}`` / ``${.b}`` are followed a bounded number
of times. Keys read (docs/launch-formats.md): trainer.*, exp_manager checkpointing, model.* shape,
parallelism, batch, recompute, optimizer (distributed_fused_adam and mcore_distributed_optim shard
optimizer state like ZeRO-1), attention kernel and precision. A value NeMo refuses when it builds the
model (an activation, granularity, optimizer or, under mcore_gpt, normalization outside its choices:
the accepted sets are beside :func:`_activation`) stops the prediction with did-you-mean.

NeMo 2.0 is configured by Python (``nemo.collections.llm`` recipes, NeMo-Run, ``nemo llm pretrain``);
its jobs are refused with a pointer to the TOML job file (:data:`NEMO2_REASON`).
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from predictor.errors import did_you_mean

from . import megatron, moe
from .configs import Config, check_duplicates, to_bool, to_int, to_number
from .facts import Facts
from .limits import MAX_INTERPOLATION_DEPTH, MAX_KEY_SUGGESTIONS, CannotPredict
from .neox_keys import refuse_choice, suggest
from .overlap import set_overlaps
from .values import MARK_OPEN, Tok

NEMO_SCRIPTS = {"megatron_gpt_pretraining.py", "megatron_gpt_continue_training.py", "megatron_llama_pretraining.py",
                "megatron_gpt_sft.py", "megatron_gpt_finetuning.py"}
DEFAULT_CONFIG = ("conf", "megatron_gpt_config")
NEMO2_REASON = ("NeMo 2.0 jobs are Python programs (nemo.collections.llm recipes / NeMo-Run) that this reader "
                "does not run; describe the job in a TOML job file (docs/job-file.md) and predict that")
# Text that marks a NeMo 2.0 recipe script (searched, never run)
NEMO2_MARKERS = re.compile(r"from\s+nemo\.collections\s+import\s+[^\n]*\bllm\b|nemo\.collections\.llm|"
                           r"import\s+nemo_run|from\s+nemo_run\b")

# The keys this reader uses (docs/launch-formats.md): a misspelling of one predicts another job.
READ_KEYS = frozenset("""
trainer.num_nodes trainer.devices trainer.precision trainer.max_steps trainer.val_check_interval
trainer.limit_val_batches exp_manager.create_checkpoint_callback
exp_manager.checkpoint_callback_params.every_n_train_steps model.num_layers model.hidden_size
model.ffn_hidden_size model.num_attention_heads model.num_query_groups model.encoder_seq_length model.seq_length
model.activation model.normalization model.position_embedding_type model.share_embeddings_and_output_weights
model.tensor_model_parallel_size model.pipeline_model_parallel_size model.virtual_pipeline_model_parallel_size
model.context_parallel_size model.sequence_parallel model.micro_batch_size model.global_batch_size
model.activations_checkpoint_granularity model.activations_checkpoint_method model.optim.name
model.optim.overlap_grad_sync model.optim.overlap_param_sync model.use_flash_attention model.mcore_gpt
model.transformer_engine model.masked_softmax_fusion model.fp8 model.fp8_recipe model.ub_tp_comm_overlap
model.num_moe_experts model.make_vocab_size_divisible_by model.tokenizer.model model.tokenizer.type
model.tokenizer.vocab_file model.window_size model.window_attn_skip_freq
""".split())

# Keys NeMo 1.x configs hold where this reader reads (besides READ_KEYS), so that a key near one it
# reads is not taken for a misspelling of it (expert_model_parallel_size is no typo of
# pipeline_model_parallel_size). Sources: NeMo's examples/nlp/language_modeling/conf/megatron_gpt_config.yaml
# and megatron_llama_config.yaml (model, exp_manager), MegatronBaseModel / build_transformer_config
# (the model keys they read), Lightning's Trainer arguments (1.x and 2.x) and exp_manager's
# ExpManagerConfig / CallbackParams (nemo/utils/exp_manager.py).  Megatron-core's TransformerConfig and
# ModelParallelConfig fields, which NeMo passes on from the model config, near a read key are here too
# (tests/launch/test_nemo.py checks every field of the installed megatron-core).
_KNOWN_KEYS = {
    "trainer": """accelerator strategy devices num_nodes precision logger callbacks fast_dev_run max_epochs min_epochs
        max_steps min_steps max_time limit_train_batches limit_val_batches limit_test_batches limit_predict_batches
        overfit_batches val_check_interval check_val_every_n_epoch num_sanity_val_steps log_every_n_steps
        enable_checkpointing enable_progress_bar enable_model_summary accumulate_grad_batches gradient_clip_val
        gradient_clip_algorithm deterministic benchmark inference_mode use_distributed_sampler profiler
        detect_anomaly barebones plugins sync_batchnorm reload_dataloaders_every_n_epochs default_root_dir
        model_registry gpus tpu_cores ipus hpus num_processes auto_select_gpus replace_sampler_ddp amp_backend
        amp_level resume_from_checkpoint track_grad_norm weights_save_path flush_logs_every_n_steps
        progress_bar_refresh_rate checkpoint_callback stochastic_weight_avg move_metrics_to_cpu
        multiple_trainloader_mode terminate_on_nan weights_summary prepare_data_per_node auto_lr_find
        auto_scale_batch_size log_gpu_memory process_position""",
    "model": """mcore_gpt micro_batch_size global_batch_size rampup_batch_size tensor_model_parallel_size
        pipeline_model_parallel_size virtual_pipeline_model_parallel_size context_parallel_size
        expert_model_parallel_size expert_tensor_parallel_size pipeline_model_parallel_split_rank encoder_seq_length
        decoder_seq_length seq_length max_position_embeddings num_layers hidden_size ffn_hidden_size
        num_attention_heads init_method_std use_scaled_init_method hidden_dropout attention_dropout ffn_dropout
        kv_channels apply_query_key_layer_scaling normalization layernorm_epsilon do_layer_norm_weight_decay
        make_vocab_size_divisible_by pre_process post_process persist_layer_norm bias activation headscale
        transformer_block_type openai_gelu normalize_attention_scores position_embedding_type rotary_percentage
        rotary_base rotary_interleaved attention_type share_embeddings_and_output_weights overlap_p2p_comm
        batch_p2p_comm num_query_groups tokenizer native_amp_init_scale native_amp_growth_interval hysteresis
        fp32_residual_connection fp16_lm_cross_entropy megatron_amp_O2 grad_allreduce_chunk_size_mb
        grad_div_ar_fusion gradient_accumulation_fusion bias_activation_fusion bias_dropout_add_fusion
        masked_softmax_fusion get_attention_mask_from_fusion apply_rope_fusion seed resume_from_checkpoint
        use_cpu_initialization onnx_safe apex_transformer_log_level gradient_as_bucket_view sync_batch_comm
        activations_checkpoint_granularity activations_checkpoint_method activations_checkpoint_num_layers
        num_micro_batches_with_partial_activation_checkpoints activations_checkpoint_layers_per_pipeline
        sequence_parallel transformer_engine fp8 fp8_e4m3 fp8_hybrid fp8_margin fp8_interval fp8_amax_history_len
        fp8_amax_compute_algo fp8_wgrad fp8_params fp8_recipe fp8_dot_product_attention fp8_multi_head_attention
        reduce_amax use_emha ub_tp_comm_overlap ub_tp_comm_overlap_cfg tp_comm_overlap_ag tp_comm_overlap_rs
        use_flash_attention cpu_offloading cpu_offloading_num_layers cpu_offloading_activations
        cpu_offloading_weights sharp mem_profile_path data nsys_profile optim gc_interval
        seq_len_interpolation_factor num_moe_experts moe_router_topk moe_grouped_gemm moe_token_dispatcher_type
        moe_aux_loss_coeff moe_z_loss_coeff moe_router_load_balancing_type moe_input_jitter_eps
        moe_per_layer_logging moe_extended_tp moe_router_pre_softmax moe_shared_expert_intermediate_size
        moe_layer_freq moe_ffn_hidden_size moe_router_score_function moe_router_num_groups moe_router_group_topk
        moe_router_topk_scaling_factor moe_router_enable_expert_bias moe_router_bias_update_rate
        moe_permute_fusion fsdp fsdp_sharding_strategy fsdp_grad_reduce_dtype fsdp_sharded_checkpoint
        fsdp_use_orig_params shape_file deterministic_mode use_te_rng_tracker te_rng_tracker attention_backend
        qk_layernorm layernorm_zero_centered_gamma scale_positional_embedding num_layers_in_first_pipeline_stage
        num_layers_in_last_pipeline_stage account_for_embedding_in_pipeline_split
        account_for_loss_in_pipeline_split nccl_communicator_config_path use_tp_pp_dp_mapping tp_only_amax_red
        window_size window_attn_skip_freq dist_ckpt_format dist_ckpt_load_on_device dist_ckpt_parallel_save
        dist_ckpt_parallel_load dist_ckpt_torch_dist_multiproc dist_ckpt_assume_constant_structure
        dist_ckpt_load_strictness dist_ckpt_parallel_save_within_dp dist_ckpt_parallel_dist_opt name
        restore_from_path peft megatron_legacy encoder_tp_size encoder_pp_size precision
        mcore_customization_config spec_overrides context_parallel_algo cp_comm_type
        defer_embedding_wgrad_compute wgrad_deferral_limit overlap_grad_reduce overlap_param_gather
        align_grad_reduce align_param_gather async_tensor_model_parallel_allreduce external_cuda_graph
        enable_cuda_graph use_transformer_engine_op_fuser num_tokentypes vocab_size padded_vocab_size
        activation_func fp4_recipe mtp_num_layers pipeline_model_parallel_layout tp_comm_overlap""",
    "model.optim": """name lr weight_decay betas eps momentum nesterov amsgrad sched bucket_cap_mb overlap_grad_sync
        overlap_param_sync contiguous_grad_buffer contiguous_param_buffer grad_sync_dtype param_sync_dtype dtype
        overlap_grad_reduce overlap_param_gather use_distributed_optimizer capturable foreach fused _target_""",
    "model.tokenizer": """library type model vocab_file merge_file delimiter sentencepiece_legacy special_tokens
        use_fast chat_template trust_remote_code bos_id eos_id additional_special_tokens r2l""",
    "exp_manager": """explicit_log_dir exp_dir name version use_datetime_version resume_if_exists resume_past_end
        resume_ignore_no_checkpoint resume_from_checkpoint create_tensorboard_logger summary_writer_kwargs
        create_wandb_logger wandb_logger_kwargs create_mlflow_logger mlflow_logger_kwargs create_dllogger_logger
        dllogger_logger_kwargs create_clearml_logger clearml_logger_kwargs create_neptune_logger
        neptune_logger_kwargs create_checkpoint_callback checkpoint_callback_params create_early_stopping_callback
        early_stopping_callback_params create_preemption_callback files_to_copy log_step_timing step_timing_kwargs
        log_local_rank_0_only log_global_rank_0_only disable_validation_on_resume ema max_time_per_run
        seconds_to_sleep create_straggler_detection_callback straggler_detection_params
        create_fault_tolerance_callback fault_tolerance log_delta_step_timing log_tflops_per_sec_per_gpu""",
    "exp_manager.checkpoint_callback_params": """filepath dirpath filename monitor verbose save_last save_top_k
        save_weights_only mode auto_insert_metric_name every_n_epochs every_n_train_steps train_time_interval
        prefix postfix save_best_model always_save_nemo save_nemo_on_train_end model_parallel_size
        save_on_train_epoch_end async_save save_last_n_optim_states""",
}
# READ_KEYS by the mapping that holds them: {"model": {"num_layers", …}, "model.optim": {"name", …}, …}
_READ_BY_SCOPE: dict = {}
for _k in READ_KEYS:
    _scope, _, _leaf = _k.rpartition(".")
    _READ_BY_SCOPE.setdefault(_scope, set()).add(_leaf)
READ_BY_SCOPE = {k: frozenset(v) for k, v in _READ_BY_SCOPE.items()}
KNOWN_KEYS = {k: frozenset(v.split()) | READ_BY_SCOPE.get(k, frozenset()) for k, v in _KNOWN_KEYS.items()}

_DELETE = object()
_INTERP = re.compile(r"^\$\{(\.*)([A-Za-z0-9_.]+)\}$")


@dataclass
class HydraArgs:
    """The Hydra command line: where the config is and the overrides, each with its origin."""

    config_path: Optional[Tok] = None
    config_name: Optional[Tok] = None
    overrides: dict = field(default_factory=dict)       # dotted key -> (value text | _DELETE, origin)
    prefixes: dict = field(default_factory=dict)        # dotted key -> "", "+", "++" or "~" as written
    unknown: Optional[str] = None                       # reason when an override's key is unknown


def read_hydra_args(args: list) -> HydraArgs:
    out = HydraArgs()
    i, n = 0, len(args)
    while i < n:
        t = args[i].text
        for flag, attr in (("--config-path", "config_path"), ("-cp", "config_path"),
                           ("--config-name", "config_name"), ("-cn", "config_name")):
            if t == flag and i + 1 < n:
                setattr(out, attr, args[i + 1])
                i += 1
                break
            if t.startswith(flag + "="):
                v = t[len(flag) + 1:]
                setattr(out, attr, Tok(v, [(v, args[i].origin_at(len(flag) + 1))]))
                break
        else:
            m = re.match(r"(\+{0,2}|~)([A-Za-z_][A-Za-z0-9_.\-@/]*)(=?)", t)
            if m and (m.group(3) or m.group(1) == "~") and MARK_OPEN not in m.group(2):
                key = m.group(2)
                out.prefixes[key] = m.group(1)
                if m.group(1) == "~":
                    out.overrides[key] = (_DELETE, args[i].origin_at(0))
                else:
                    val = t[m.end():]
                    out.overrides[key] = (_strip_quotes(val), args[i].origin_at(m.end()))
            elif MARK_OPEN in t and out.unknown is None:
                out.unknown = t
        i += 1
    return out


def _strip_quotes(v: str) -> str:
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]
    return v


def config_file(h: HydraArgs, script: Optional[Tok], cwd: Optional[str]) -> tuple[str, str]:
    """(path of the base config, origin to blame) as Hydra resolves them."""
    script_dir = posixpath.dirname(script.text) if script is not None else ""
    if h.config_path is not None:
        d, origin = h.config_path.text, h.config_path.origin_at(0)
        if not posixpath.isabs(d):
            # Hydra: a relative --config-path is relative to the script that declares @hydra.main
            d = posixpath.join(script_dir, d) if script_dir else d
    else:
        d, origin = posixpath.join(script_dir, DEFAULT_CONFIG[0]), (script.origin_at(0) if script else "")
    name = h.config_name.text if h.config_name is not None else DEFAULT_CONFIG[1]
    if h.config_name is not None:
        origin = h.config_name.origin_at(0)
    if not name.endswith((".yaml", ".yml")):
        name += ".yaml"
    return posixpath.join(d, name), origin


class View:
    """The base config seen through the command-line overrides; every value with its origin."""

    def __init__(self, cfg: Config, h: HydraArgs):
        self.cfg, self.h = cfg, h

    def raw(self, dotted: str) -> tuple[Any, str, bool]:
        """(value, origin, found)."""
        ov = self.h.overrides.get(dotted)
        if ov is not None:
            if ov[0] is _DELETE:
                return None, ov[1], False
            return ov[0], f"{ov[1]} (override {dotted})", True
        node: Any = self.cfg.data
        parts = dotted.split(".")
        for p in parts:
            if not isinstance(node, dict) or p not in node:
                return None, "", False
            node = node[p]
        return node, self.cfg.origin(tuple(parts)), True

    def get(self, dotted: str) -> tuple[Any, str, bool]:
        """Like raw, following ``${abs.key}`` / ``${.sibling}`` interpolations (bounded)."""
        value, origin, found = self.raw(dotted)
        key = dotted
        for _ in range(MAX_INTERPOLATION_DEPTH):
            m = _INTERP.match(value) if isinstance(value, str) else None
            if not m:
                return value, origin, found
            dots, target = m.group(1), m.group(2)
            if dots:
                base = key.split(".")[:-len(dots)] if len(dots) <= key.count(".") + 1 else []
                target = ".".join(base + [target])
            key = target
            value, o2, found = self.raw(target)
            origin = o2 or origin
        return None, origin, False


def _lookup(data: Any, dotted: str) -> tuple[bool, list]:
    """(whether ``dotted`` is in the config, the keys of the deepest mapping reached on the way)."""
    node = data
    for p in dotted.split("."):
        if not isinstance(node, dict):
            return False, []
        if p not in node:
            return False, [k for k in node if isinstance(k, str)]
        node = node[p]
    return True, []


def check_overrides(cfg: Config, h: HydraArgs, warnings: list) -> None:
    """What Hydra does with the command line before NeMo starts: ``key=v`` and ``~key`` need the key
    in the config (NeMo's configs are in struct mode: "Could not override … Key … is not in struct"),
    ``+key=v`` needs it absent. Either mistake stops the job at start, so the prediction stops too.

    A config with a ``defaults:`` list composes others this reader does not open: a missing key
    may come from them, so it is a warning there, unless it looks like a misspelling of a key the
    reader uses.
    """
    composed = isinstance(cfg.data, dict) and "defaults" in cfg.data
    looks = 0       # difflib look-ups, bounded as every reader's (MAX_KEY_SUGGESTIONS)
    for key, prefix in h.prefixes.items():
        if key.startswith("hydra.") or "/" in key or "@" in key:
            continue                      # Hydra's own settings and config-group choices
        origin = h.overrides[key][1]
        found, siblings = _lookup(cfg.data, key)
        if prefix == "+" and found:
            raise CannotPredict(f"+{key}: already in {posixpath.basename(cfg.label)}, and Hydra refuses to add it "
                                f"again (NeMo stops at start; {key}=… or ++{key}=… sets it)", origin)
        if prefix == "+" and not found and key not in READ_KEYS:
            looks += 1
            if looks <= MAX_KEY_SUGGESTIONS:
                _near_miss_addition(cfg, key, origin, warnings)
        if prefix in ("", "~") and not found:
            parent, _, leaf = key.rpartition(".")
            looks += 1
            guess = suggest(leaf, frozenset(siblings)) if siblings and looks <= MAX_KEY_SUGGESTIONS else None
            near = f"; did you mean {parent + '.' if parent else ''}{guess}?" if guess else ""
            where = posixpath.basename(cfg.label)
            why = (f"{'~' if prefix == '~' else ''}{key}: not in {where}, and Hydra refuses to "
                   f"{'delete' if prefix == '~' else 'set'} a key the config lacks (NeMo stops at start"
                   f"{'' if prefix == '~' else f'; +{key}=… adds one'}){near}")
            if composed and not (guess and f"{parent}.{guess}".lstrip(".") in READ_KEYS):
                warnings.append(f"{why} — unless a config in its defaults list has it ({origin})")
                continue
            raise CannotPredict(why, origin)


def check_config_keys(cfg: Config, h: HydraArgs, warnings: list) -> None:
    """A key of the base config, in a mapping this reader reads (model, trainer, model.optim, …),
    that is a likely misspelling of a key it reads: NeMo reads the model's keys with defaults and
    never looks at one it does not know (``pipline_model_parallel_size: 2`` trains with pp 1), and
    Lightning's Trainer refuses an unknown argument at start, so the prediction stops, at the key's
    line, with did-you-mean. Only near misses of read keys are said: NeMo's configs hold many keys
    this reader does not read (:data:`KNOWN_KEYS` names those near the read ones), and any other key
    passes in silence. When the key meant is set too, the misspelt one is only warned about."""
    data = cfg.data if isinstance(cfg.data, dict) else {}
    looked = 0
    for scope, read in READ_BY_SCOPE.items():
        node: Any = data
        for p in scope.split("."):
            node = node.get(p) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        known = KNOWN_KEYS[scope]
        for key in node:
            if not isinstance(key, str) or key in known:
                continue
            looked += 1
            if looked > MAX_KEY_SUGGESTIONS:
                return
            guess = suggest(key, known)
            if guess is None or guess not in read:
                continue
            dotted, meant = f"{scope}.{key}", f"{scope}.{guess}"
            origin = cfg.key_origin(tuple(scope.split(".")) + (key,))
            over = h.overrides.get(meant)
            if guess in node or (over is not None and over[0] is not _DELETE):
                where = cfg.origin(tuple(meant.split("."))) if guess in node else over[1]
                warnings.append(f"{dotted} is not a NeMo config key and is ignored, so {meant} as set at {where} "
                                f"stands; did you mean {meant}? ({origin})")
                continue
            if scope == "trainer":
                raise CannotPredict(f"{dotted} is not an argument of Lightning's Trainer: NeMo stops at start "
                                    f"(Trainer(**cfg.trainer) raises TypeError); did you mean {meant}?", origin)
            raise CannotPredict(f"{dotted} is not a NeMo config key and would be ignored; did you mean {meant}? "
                                f"(without it the job would be a different one)", origin)


def _near_miss_addition(cfg: Config, key: str, origin: str, warnings: list) -> None:
    """``+a.b=v`` adds ``b`` to ``a``; when ``b`` looks like a misspelling of a key ``a`` has or NeMo
    reads there, NeMo starts and ignores the added key: warned."""
    parent, _, leaf = key.rpartition(".")
    node = cfg.data
    for p in parent.split(".") if parent else ():
        node = node.get(p) if isinstance(node, dict) else None
    known = {k for k in node if isinstance(k, str)} if isinstance(node, dict) else set()
    known |= {k[len(parent) + 1:] for k in READ_KEYS if k.startswith(parent + ".") and "." not in k[len(parent) + 1:]}
    guess = suggest(leaf, frozenset(known)) if known else None
    if guess is not None:
        full = f"{parent}.{guess}" if parent else guess
        warnings.append(f"+{key}: adds a key NeMo does not read (it reads {full}), so the job runs without it; "
                        f"did you mean {'' if _lookup(cfg.data, full)[0] else '+'}{full}? ({origin})")


def _set_int(f: Facts, v: View, dotted: str, fact: str, allow_null: bool = False) -> None:
    value, origin, found = v.get(dotted)
    if not found or (value is None and allow_null):
        return
    f.set_int_value(fact, value, origin, what=dotted)


def _str(v: View, dotted: str) -> tuple[Optional[str], str]:
    value, origin, found = v.get(dotted)
    if not found or value is None or (isinstance(value, str) and MARK_OPEN in value):
        return None, origin
    return str(value), origin


def _bool(v: View, dotted: str) -> tuple[Optional[bool], str]:
    value, origin, found = v.get(dotted)
    if not found or (isinstance(value, str) and MARK_OPEN in value):
        return None, origin
    return to_bool(value), origin


def read(cfg: Config, h: HydraArgs, f: Facts) -> None:
    """Fill facts from the NeMo config and its overrides (framework "nemo")."""
    v = View(cfg, h)
    w = f.warnings
    if not isinstance(cfg.data, dict):
        raise CannotPredict(f"{cfg.label} is not a mapping of NeMo config sections", cfg.label)
    if cfg.duplicates:     # Hydra composes with OmegaConf, whose YAML loader refuses a key twice
        check_duplicates(cfg, "Hydra (OmegaConf)", True, w)
    check_overrides(cfg, h, w)
    check_config_keys(cfg, h, w)
    ne, ne_origin, found = v.get("model.num_moe_experts")
    if found:
        moe.check_count(ne, "model.num_moe_experts", ne_origin)
    dev, _o, found = v.get("trainer.devices")
    if found and str(dev).strip().lower() not in ("auto", "-1"):
        # "auto" / -1 = every GPU of the node: the launcher's rank count stands
        _set_int(f, v, "trainer.devices", "nemo_devices")
    for dotted, fact in (("trainer.num_nodes", "nemo_nodes"),
                         ("trainer.max_steps", "train_iters"),
                         ("model.num_layers", "layers"), ("model.hidden_size", "hidden"),
                         ("model.ffn_hidden_size", "ffn_hidden"), ("model.num_attention_heads", "heads"),
                         ("model.encoder_seq_length", "seq_len"),
                         ("model.tensor_model_parallel_size", "tp"), ("model.pipeline_model_parallel_size", "pp"),
                         ("model.context_parallel_size", "cp"), ("model.micro_batch_size", "micro_batch"),
                         ("model.global_batch_size", "global_batch"),
                         ("model.make_vocab_size_divisible_by", "vocab_divisible")):
        _set_int(f, v, dotted, fact)
    _set_int(f, v, "model.num_query_groups", "kv_heads", allow_null=True)
    _set_int(f, v, "model.virtual_pipeline_model_parallel_size", "virtual_stages", allow_null=True)
    if f.get("seq_len") is None:
        _set_int(f, v, "model.seq_length", "seq_len")
    if f.known("train_iters") and f.val("train_iters") < 0:
        f.set_unknown("train_iters", "trainer.max_steps is -1: the run is bounded by max_epochs and the data set",
                      f.origin("train_iters"))
    if f.get("ffn_hidden") is None and f.known("hidden"):
        f.set("ffn_hidden", 4 * f.val("hidden"), "NeMo default (4 × hidden_size)")
    _evaluation(v, f)
    _checkpoints(v, f)
    mcore, _ = _bool(v, "model.mcore_gpt")     # MegatronGPTModel: cfg.get('mcore_gpt', False)
    _activation(v, f)
    _normalization(v, f, bool(mcore))
    _positions(v, f)
    tied, origin = _bool(v, "model.share_embeddings_and_output_weights")
    f.set("tied_embeddings", True if tied is None else tied, origin or "NeMo default")
    f.set("parallel_residual", False, "NeMo GPT")
    sp, origin = _bool(v, "model.sequence_parallel")
    f.set("sequence_parallel", bool(sp), origin or "NeMo default")
    _attention(v, f)
    _window(v, f)
    _precision(v, f)
    _overlaps(v, f)
    gran, origin = _str(v, "model.activations_checkpoint_granularity")
    if gran is not None and gran.strip().lower() not in ("", "null"):
        # Megatron-core's TransformerConfig (recompute_granularity) and NeMo's legacy
        # ParallelTransformer both raise ValueError at model build for another value
        if gran not in ("full", "selective"):
            _refuse("model.activations_checkpoint_granularity", gran, ("full", "selective"),
                    "NeMo stops when it builds the model (full, selective or null)", origin)
        f.set("recompute", gran, origin)
        method, m_origin = _str(v, "model.activations_checkpoint_method")
        if gran == "full" and (method or "").lower() == "block":
            w.append(f"activations_checkpoint_method block recomputes only some layers per stage; "
                     f"modelled as full recompute ({m_origin})")
    else:
        f.set("recompute", "none", origin or "NeMo default (no activation checkpointing)")
    opt, origin = _str(v, "model.optim.name")
    target, _ = _str(v, "model.optim._target_")
    # With a _target_ NeMo instantiates that class and never looks the name up.
    if opt is not None and opt not in NEMO_OPTIMIZERS and target is None:
        _refuse("model.optim.name", opt, NEMO_OPTIMIZERS, "NeMo stops at start (get_optimizer: "
                "\"Cannot resolve optimizer\")", origin, "NeMo's optimizers")
    if opt in DISTRIBUTED_OPTIMIZERS:
        f.set("zero_stage", 1, origin)   # optimizer state sharded over data-parallel ranks, as ZeRO-1
    else:
        f.set("zero_stage", 0, origin or "NeMo default")
    f.set("pipe_split", "megatron", "NeMo (Megatron-core: layers split evenly over the stages)")
    # vocabulary: the tokenizer's model/type names a known tokenizer, else the GPT-2 default
    for key, fact in (("model.tokenizer.model", "tokenizer_model"), ("model.tokenizer.type", "tokenizer"),
                      ("model.tokenizer.vocab_file", "vocab_file")):
        s, origin = _str(v, key)
        if s:
            f.set(fact, s, origin)
    if h.unknown is not None:
        f.hidden_args = f.u.reason(h.unknown) or "unknown"


# Accepted values, from NeMo 1.x's sources (the versions whose Hydra launches this reader reads):
# model.activation: activation_to_func's supported_activations
# (nemo/collections/nlp/modules/common/megatron/utils.py), which raises ValueError for another name;
# a name ending in "glu" is a gated MLP (gated_linear_unit = activation.endswith('glu')).
NEMO_ACTIVATIONS = ("gelu", "geglu", "reglu", "swiglu", "squared-relu", "fast-geglu", "fast-swiglu", "fast-reglu",
                    "approx-gelu")
# model.normalization under mcore_gpt: build_transformer_config lower-cases it and knows layernorm,
# rmsnorm and layernorm1p; another name goes to Megatron-core as is, whose TENorm / local norm raise
# ("Only LayerNorm and RMSNorm are curently supported").  The legacy (non-mcore) model builds
# LayerNorm for these three names and MixedFusedRMSNorm for any other (modules/common/megatron/transformer.py).
NEMO_MCORE_NORMS = ("layernorm", "rmsnorm", "layernorm1p")
NEMO_LEGACY_LAYERNORMS = ("layernorm", "layernorm1p", "low_precision_layernorm")
# model.position_embedding_type: the types NeMo's GPT models build (docs/source/nlp/pos_emb.rst;
# language_model.py).  Neither Megatron-core's LanguageModelEmbedding nor NeMo's legacy Embedding
# checks the name: another one builds no position embedding at all.
NEMO_POSITIONS = {"learned_absolute": "learned", "rope": "rotary", "alibi": "alibi", "none": "none",
                  "xpos": "rotary", "kerple": "alibi", "sandwich": "alibi"}
# model.optim.name: AVAILABLE_OPTIMIZERS of nemo/core/optim/optimizers.py (apex's lamb and fused_adam,
# NeMo's distributed_fused_adam and megatron_fused_adam among them) and mcore_distributed_optim, which
# megatron_base_model.py builds itself; get_optimizer raises for another name.
NEMO_OPTIMIZERS = ("sgd", "adam", "adamw", "adadelta", "adamax", "adagrad", "rmsprop", "rprop", "novograd",
                   "adafactor", "adan", "lamb", "fused_adam", "distributed_fused_adam", "megatron_fused_adam",
                   "mcore_distributed_optim")
# The two that shard optimizer state over the data-parallel ranks (with_distributed_adam), as ZeRO-1
DISTRIBUTED_OPTIMIZERS = ("distributed_fused_adam", "mcore_distributed_optim")


def _refuse(what: str, value: str, accepted: tuple, stops: str, origin: str, choices: str = "") -> None:
    """refuse_choice, but a value that differs from an accepted one in case alone (NeMo compares as
    written) is told that one rather than the nearest spelling."""
    same = [a for a in accepted if a.lower() == value.lower()]
    refuse_choice(what, value, same or accepted, stops, origin, choices or ", ".join(accepted))


def _activation(v: View, f: Facts) -> None:
    """model.activation: another name than NeMo's stops; a gated one is costed as SwiGLU (same
    shapes: the up projection makes gate and up together), an ungated one as GELU."""
    act, origin = _str(v, "model.activation")
    act = act if act is not None else "gelu"
    if act not in NEMO_ACTIVATIONS:
        _refuse("model.activation", act, NEMO_ACTIVATIONS,
                "NeMo stops when it builds the model (activation_to_func raises)", origin)
    gated = act.endswith("glu")
    f.set("activation", "swiglu" if gated else "gelu", origin or "NeMo default")
    if act not in ("gelu", "swiglu", "fast-swiglu"):
        shape = "a gated MLP of the same shapes" if gated else "an ungated MLP of the same shapes"
        f.warnings.append(f"activation {act} is modelled as {'swiglu' if gated else 'gelu'} ({shape}; its "
                          f"element-wise function is not costed apart) ({origin})")


def _normalization(v: View, f: Facts, mcore: bool) -> None:
    norm, origin = _str(v, "model.normalization")
    if norm is None:
        f.set("norm", "layernorm", origin or "NeMo default")
        return
    if mcore:
        if norm.lower() not in NEMO_MCORE_NORMS:
            _refuse("model.normalization", norm, NEMO_MCORE_NORMS, "NeMo passes it to Megatron-core "
                    "(mcore_gpt), whose norm raises when the model is built", origin)
        f.set("norm", "rmsnorm" if norm.lower() == "rmsnorm" else "layernorm", origin)
        return
    if norm in NEMO_LEGACY_LAYERNORMS:
        f.set("norm", "layernorm", origin)
        return
    f.set("norm", "rmsnorm", origin)
    if norm != "rmsnorm":
        near = did_you_mean(norm, NEMO_LEGACY_LAYERNORMS + ("rmsnorm",))
        f.warnings.append(f"model.normalization {norm!r}: NeMo's legacy (non-mcore) GPT builds RMSNorm for any "
                          f"name but {', '.join(NEMO_LEGACY_LAYERNORMS)}, so it is modelled as rmsnorm{near} "
                          f"({origin})")


def _positions(v: View, f: Facts) -> None:
    pos, origin = _str(v, "model.position_embedding_type")
    pos = pos if pos is not None else "learned_absolute"
    mapped = NEMO_POSITIONS.get(pos)
    if mapped is None:
        mapped = "none"
        near = did_you_mean(pos, NEMO_POSITIONS) or did_you_mean(pos.lower(), NEMO_POSITIONS)
        f.warnings.append(f"model.position_embedding_type {pos!r} is not one of {', '.join(NEMO_POSITIONS)}: NeMo "
                          f"does not check it and builds no position embedding, so the job trains without one "
                          f"(modelled as none){near} ({origin})")
    f.set("pos_emb", mapped, origin or "NeMo default")


def _evaluation(v: View, f: Facts) -> None:
    val, origin, found = v.get("trainer.val_check_interval")
    n = to_number(val) if found else None
    if not found:
        f.set("eval_interval", 0, "Lightning default (validation once per epoch)")
    elif isinstance(val, str) and MARK_OPEN in val:
        f.set_unknown("eval_interval", f.u.reason(val) or "unknown", origin)
    elif isinstance(n, int) and not isinstance(n, bool) and n > 1:
        f.set("eval_interval", n, origin)
    else:
        f.warnings.append(f"trainer.val_check_interval {val!r} is a fraction of an epoch ({origin}); "
                          f"evaluation is not modelled")
        f.set("eval_interval", 0, origin)
    lim, origin, found = v.get("trainer.limit_val_batches")
    n = to_number(lim) if found else None
    if found and isinstance(n, int) and not isinstance(n, bool):
        f.set("eval_iters", n, origin)
    elif found and isinstance(n, float) and n == 0:
        f.set("eval_iters", 0, origin)
    elif found:
        f.warnings.append(f"trainer.limit_val_batches {lim!r} is a fraction of the validation set ({origin}); "
                          f"evaluation is not modelled")
        f.set("eval_iters", 0, origin)
    else:
        f.set("eval_iters", 0, "Lightning default (the whole validation set; not modelled)")


def _checkpoints(v: View, f: Facts) -> None:
    create, origin = _bool(v, "exp_manager.create_checkpoint_callback")
    if create is False:
        f.set("save_interval", 0, origin)
        return
    val, origin, found = v.get("exp_manager.checkpoint_callback_params.every_n_train_steps")
    n = to_int(val) if found else None
    if n is not None and n > 0:
        f.set("save_interval", n, origin)
    elif f.known("eval_interval") and f.val("eval_interval") > 0:
        # NeMo's checkpoint callback saves at each validation when no step interval is given
        f.set("save_interval", f.val("eval_interval"), f.origin("eval_interval"))


def _attention(v: View, f: Facts) -> None:
    flash, origin = _bool(v, "model.use_flash_attention")
    mcore, m_origin = _bool(v, "model.mcore_gpt")
    te, t_origin = _bool(v, "model.transformer_engine")
    if flash:
        f.set("attention", "flash", origin)
        if not (mcore and te is not False):
            f.set("attention_impl", "flash2", origin)    # NeMo's own attention calls the flash_attn package
        else:
            megatron.te_backend_from_env(f)
        return
    if mcore and te is not False:
        # Megatron-core's Transformer Engine attention picks a flash/cuDNN fused kernel on current GPUs
        f.set("attention", "flash", m_origin)
        if not megatron.te_backend_from_env(f):
            f.warnings.append("attention kernel: NeMo's mcore_gpt with Transformer Engine is assumed to use flash "
                              "attention")
        return
    fused, origin2 = _bool(v, "model.masked_softmax_fusion")
    f.set("attention", "unfused" if fused is False else "fused_softmax", origin2 or "NeMo default")


def _window(v: View, f: Facts) -> None:
    """``model.window_size`` [left, right] (and ``model.window_attn_skip_freq``): NeMo's
    ``build_transformer_config`` hands every model key named like a field of Megatron-core's
    TransformerConfig to it (megatron_base_model.py), so an mcore model's attention gets the
    window as Megatron-LM's --window-size gives it (megatron.set_window)."""
    raw, origin, found = v.get("model.window_size")
    skip, s_origin, s_found = v.get("model.window_attn_skip_freq")
    if not found or raw is None:
        return
    if isinstance(raw, str) and MARK_OPEN in raw:
        f.set_unknown("attention_window", f.u.reason(raw) or "unknown", origin)
        return
    pair = megatron.window_pair(raw, "model.window_size", origin, brackets=True)
    if pair is None:
        return
    mcore, _m_origin = _bool(v, "model.mcore_gpt")
    if not mcore:
        f.warnings.append(f"model.window_size: NeMo passes it to Megatron-core's TransformerConfig, which only "
                          f"mcore_gpt models build; ignored, full causal attention ({origin})")
        return
    if s_found and isinstance(skip, str) and (MARK_OPEN in skip or skip.strip().lower() in ("null", "none", "~")):
        if MARK_OPEN in skip:
            f.warnings.append(f"model.window_attn_skip_freq is unknown: every layer costed as full causal "
                              f"attention (an upper bound) ({s_origin})")
            return
        skip = None
    megatron.set_window(f, pair, "model.window_size", origin, skip if s_found else None,
                        "model.window_attn_skip_freq", s_origin)


def _overlaps(v: View, f: Facts) -> None:
    """NeMo's communication overlaps (launch/overlap.py).  The distributed fused Adam overlaps its gradient reduction
    unless told not to."""
    found = {}
    tp, origin = _bool(v, "model.ub_tp_comm_overlap")
    if tp:
        found["tp"] = f"model.ub_tp_comm_overlap ({origin})"
    name, _ = _str(v, "model.optim.name")
    distributed = name == "distributed_fused_adam"
    grad, origin = _bool(v, "model.optim.overlap_grad_sync")
    if grad or (grad is None and distributed):
        found["grad"] = (f"model.optim.overlap_grad_sync ({origin})" if grad
                         else "model.optim.name distributed_fused_adam (overlap_grad_sync defaults on)")
    param, origin = _bool(v, "model.optim.overlap_param_sync")
    if param:
        found["param"] = f"model.optim.overlap_param_sync ({origin})"
    set_overlaps(f, found, name in DISTRIBUTED_OPTIMIZERS, bool(f.val("sequence_parallel")))


def _precision(v: View, f: Facts) -> None:
    fp8, origin = _bool(v, "model.fp8")
    p, p_origin = _str(v, "trainer.precision")
    if fp8:
        # The layers' linear GEMMs in FP8, all else in bf16 (Transformer Engine).  NeMo's default
        # is delayed scaling; a model.fp8_recipe other than "delayed" scales each tensor from
        # itself (run.fp8 "current").
        raw, r_origin = _str(v, "model.fp8_recipe")
        recipe = "delayed" if (raw or "delayed").lower() == "delayed" else "current"
        f.set("fp8_recipe", recipe, r_origin if raw else "NeMo default (delayed scaling)")
        f.set("precision", "bf16", origin)
        return
    p = (p or "32").lower()
    if p.startswith("bf16"):
        f.set("precision", "bf16", p_origin)
    elif p.startswith("16"):
        f.set("precision", "fp16", p_origin)
    elif p.startswith("32") or p.startswith("64"):
        f.set("precision", "fp32", p_origin or "Lightning default (32)")
    else:
        f.warnings.append(f"trainer.precision {p!r} is not 16/bf16/32 ({p_origin}); modelled as bf16")
        f.set("precision", "bf16", p_origin)
