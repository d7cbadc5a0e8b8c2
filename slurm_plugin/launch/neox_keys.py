"""Names of GPT-NeoX arguments and DeepSpeed config keys, for catching misspelt keys.

Only names, taken from GPT-NeoX's documented arguments (megatron/neox_arguments/neox_args.py,
deepspeed_args.py, configs/neox_arguments.md; current and 2021-2023 versions, so old configs
are not flagged) and DeepSpeed's config-json documentation (https://www.deepspeed.ai/docs/config-json/).

A key outside these lists is read by nobody: NeoX would run without it. When it is a likely
misspelling (difflib) of a key that shapes the model or the layout, predicting without it would
predict a different job, so the parse stops (:func:`check_keys`).
"""
from __future__ import annotations

import difflib
import functools
from typing import Any, Callable, Iterable, NoReturn, Optional

from predictor.errors import did_you_mean

from .configs import key_origin, to_bool, to_int
from .limits import MAX_KEY_SUGGESTIONS, CannotPredict
from .values import MARK_OPEN

_NEOX = """
pipe_parallel_size model_parallel_size pipe_partition_method world_size is_pipe_parallel sequence_parallel
expert_interval precision model_arch num_encoder_layers num_layers hidden_size intermediate_size
mlp_multiple_of expansion_factor feedforward_size num_attention_heads num_kv_heads seq_length
decoder_seq_length sliding_window_width max_position_embeddings norm layernorm_fusion rmsnorm_fusion
use_qk_layernorm layernorm_epsilon rms_norm_epsilon scalenorm_epsilon pos_emb rpe_num_buckets
rpe_max_distance opt_pos_emb_offset no_weight_tying attention_config sparsity_config num_unique_layers
param_sharing_style extra_sentinel_tokens make_vocab_size_divisible_by activation use_flashattn_swiglu
scaled_upper_triang_masked_softmax_fusion scaled_masked_softmax_fusion bias_gelu_fusion
bias_dropout_fusion rope_fusion fp16_lm_cross_entropy init_method_std apply_query_key_layer_scaling
use_cpu_initialization attention_softmax_in_fp32 rotary_pct rotary_emb_base rotary_save_freqs_buffer
init_method output_layer_init_method gmlp_attn_dim gpt_j_residual gpt_j_tied use_bias_in_norms
use_bias_in_attn_linear use_bias_in_mlp soft_prompt_tuning output_layer_parallelism mlp_type
packing loss_on_targets_only masked_lm_prob mean_noise_span_length
te_columnparallel te_rowparallel te_layernorm_mlp te_mha te_fp8_format te_fp8_wgrad te_fp8_amax_history_len
te_fp8_amax_compute_algo te_fp8_margin te_fp8_mha dim_att head_size ffn_dim num_experts
mamba_selective_scan_fusion mamba_causal_conv_fusion mamba_inner_func_fusion mamba_selective_fp32_params
mamba_use_bias_in_conv mamba_use_bias_in_linears
moe_type moe_num_experts moe_top_k moe_router_type moe_lbl_in_fp32 moe_jitter_eps moe_use_residual
moe_loss_coeff moe_train_capacity_factor moe_eval_capacity_factor moe_min_capacity moe_token_dropping
moe_expert_parallel_size moe_glu enable_expert_tensor_parallelism create_moe_param_group
optimizer_type use_bnb_optimizer zero_stage zero_reduce_scatter zero_contiguous_gradients
zero_reduce_bucket_size zero_allgather_bucket_size lr lr_decay_style lr_decay_iters lr_decay_fraction
min_lr warmup override_lr_scheduler use_checkpoint_lr_scheduler
use_wandb wandb_group wandb_team wandb_project wandb_host wandb_init_all_ranks wandb_run_name git_hash
log_dir tensorboard_writer tensorboard_dir log_interval log_grad_pct_zeros log_param_norm log_grad_norm
log_optimizer_states log_gradient_noise_scale gradient_noise_scale_n_batches
gradient_noise_scale_cpu_offload memory_profiling memory_profiling_path profile profile_step_start
profile_step_stop use_comet comet_workspace comet_project comet_experiment_name comet_tags comet_others
peak_theoretical_tflops use_tensorboard
distributed_backend local_rank rank lazy_mpu_init short_seq_prob eod_mask_loss adlr_autoresume
adlr_autoresume_interval seed onnx_safe deepscale deepscale_config deepspeed_mpi deepspeed_slurm
user_script iteration do_train do_valid do_test save_iters global_num_gpus
tokenizer_type padded_vocab_size data_path use_shared_fs train_data_paths label_data_paths
test_data_paths valid_data_paths train_data_weights valid_data_weights test_data_weights
train_label_data_paths test_label_data_paths valid_label_data_paths pos_train_data_paths
neg_train_data_paths pos_valid_data_paths neg_valid_data_paths pos_test_data_paths neg_test_data_paths
pos_train_label_data_paths neg_train_label_data_paths pos_valid_label_data_paths
neg_valid_label_data_paths pos_test_label_data_paths neg_test_label_data_paths
weight_by_num_documents weighted_sampler_alpha data_impl pack_impl dataset_impl train_impl
allow_chopped mmap_warmup save s3_path s3_chunk_size config_files load
checkpoint_validation_with_forward_pass checkpoint_scale checkpoint_factor extra_save_iters
no_save_optim no_save_rng no_load_optim no_load_rng finetune batch_size train_iters train_epochs
eval_iters keep_last_n_checkpoints eval_interval split vocab_file merge_file num_workers exit_interval
attention_dropout hidden_dropout weight_decay checkpoint_activations checkpoint_num_layers
deepspeed_activation_checkpointing contiguous_checkpointing checkpoint_in_cpu synchronize_each_layer
profile_backward partition_activations clip_grad hysteresis dynamic_loss_scale loss_scale
loss_scale_window min_scale char_level_ppl use_mup coord_check save_base_shapes base_shapes_file
mup_init_scale mup_attn_temp mup_output_temp mup_embedding_mult mup_rp_embedding_mult mup_width_scale
precompute_model_name dpo_fp32 dpo_reference_free dpo_beta kto_fp32 kto_desirable_weight
kto_undesirable_weight kto_beta allow_chopped z_loss num_gpus num_nodes
text_gen_type temperature top_p top_k return_logits maximum_tokens prompt_end sample_input_file
sample_output_file num_samples recompute eval_results_prefix eval_tasks
save_interval gas curriculum_seqlen
"""

# Top-level keys of a DeepSpeed config (NeoX passes these through to DeepSpeed too).
_DEEPSPEED = """
deepspeed train_batch_size train_micro_batch_size_per_gpu gradient_accumulation_steps optimizer
scheduler fp32_allreduce prescale_gradients gradient_predivide_factor sparse_gradients fp16 bf16
bfloat16 amp gradient_clipping zero_optimization zero_allow_untested_optimizer
zero_force_ds_cpu_optimizer curriculum_learning steps_per_print wall_clock_breakdown dump_state
flops_profiler communication_data_type seq_parallel_communication_data_type autotuning
activation_checkpointing sparse_attention data_efficiency tensorboard wandb csv_monitor comet
elasticity comms_logger compression_training checkpoint data_types deepspeed_extra_args
load_universal aio pipeline memory_breakdown disable_allgather nebula compile timers hybrid_engine
eigenvalue progressive_layer_drop quantize_training gradient_accumulation_dtype
use_data_before_expert_parallel_ graph_harvesting dataloader_drop_last weight_quantization
zero_legacy_stage1 fp8 torch_autocast
"""

# deepspeed.launcher.runner options that NeoX reads from the YAML
_RUNNER = """
hostfile include exclude num_nodes num_gpus master_port master_addr launcher force_multi
detect_nvlink_pairs autotuning_run no_ssh_check comment account launcher_args
"""

DEEPSPEED_KEYS = frozenset(_DEEPSPEED.split())
NEOX_KEYS = frozenset(_NEOX.split()) | DEEPSPEED_KEYS | frozenset(_RUNNER.split())

# Keys that decide the model's shape, the layout or the batch: a misspelling stops the parse.
NEOX_SHAPE_KEYS = frozenset("""
pipe_parallel_size model_parallel_size num_layers hidden_size num_attention_heads num_kv_heads
seq_length max_position_embeddings intermediate_size train_micro_batch_size_per_gpu
gradient_accumulation_steps train_batch_size train_iters zero_optimization precision
global_num_gpus sequence_parallel checkpoint_activations partition_activations checkpoint_in_cpu
synchronize_each_layer sliding_window_width
""".split())
DEEPSPEED_SHAPE_KEYS = frozenset("""
train_batch_size train_micro_batch_size_per_gpu gradient_accumulation_steps zero_optimization fp16 bf16
""".split())

# Keys of DeepSpeed's zero_optimization section (runtime/zero/config.py, current and 2021-2023
# releases); ``stage`` decides the layout's sharding, so its misspelling stops the parse.
ZERO_KEYS = frozenset("""
stage contiguous_gradients reduce_scatter reduce_bucket_size use_multi_rank_bucket_allreduce
allgather_partitions allgather_bucket_size overlap_comm load_from_fp32_weights elastic_checkpoint
offload_param offload_optimizer sub_group_size cpu_offload_param cpu_offload_use_pin_memory cpu_offload
prefetch_bucket_size param_persistence_threshold model_persistence_threshold max_live_parameters
max_reuse_distance gather_16bit_weights_on_model_save module_granularity_threshold
use_all_reduce_for_fetch_params stage3_gather_fp16_weights_on_model_save ignore_unused_parameters
legacy_stage1 round_robin_gradients zero_hpz_partition_size zero_quantized_weights
zero_quantized_nontrainable_weights zero_quantized_gradients zeropp_loco_param mics_shard_size
mics_hierarchical_params_gather memory_efficient_linear pipeline_loading_checkpoint override_module_apply
log_trace_cache_warnings stage3_max_live_parameters stage3_max_reuse_distance stage3_prefetch_bucket_size
stage3_param_persistence_threshold stage3_model_persistence_threshold stage3_gather_16bit_weights_on_model_save
stage3_module_granularity_threshold stage3_use_all_reduce_for_fetch_params cpu_offload_params
""".split())
ZERO_SHAPE_KEYS = frozenset({"stage"})
# The fp16 / bf16 sections (deepspeed/runtime/precision_config.py; ``type`` is DeeperSpeed's, GPT-NeoX
# configs set ``fp16: {type: bfloat16}``).  The ``amp`` section passes its keys on to apex, unchecked.
PRECISION_KEYS = {
    "fp16": frozenset("""enabled auto_cast loss_scale initial_scale_power loss_scale_window hysteresis
consecutive_hysteresis min_loss_scale fp16_master_weights_and_grads type""".split()),
    "bf16": frozenset("""enabled immediate_grad_update check_grad_overflow bf16_master_weights_and_grads
bf16_optimizer_states""".split()),
}
PRECISION_KEYS["bfloat16"] = PRECISION_KEYS["bf16"]
# What DeepSpeed says when contiguous checkpointing is asked without partitioned activations
# (runtime/activation_checkpointing/checkpointing.py, configure): GPT-NeoX's keys and
# Megatron-DeepSpeed's flags reach the same check.
CONTIGUOUS_NEEDS_PARTITION = ('DeepSpeed stops at start-up '
                              '("Contiguous Checkpointing is only available with partitioned activations")')
# Keys of DeepSpeed's activation_checkpointing section (runtime/activation_checkpointing/config.py);
# DeepSpeed reads them with defaults, so a misspelt one is silently off there: warned here.
ACTIVATION_CHECKPOINTING_KEYS = frozenset("""
partition_activations contiguous_memory_optimization cpu_checkpointing number_checkpoints
synchronize_checkpoint_boundary profile
""".split())

_MAX_KEY_LEN = 80     # longer names are no misspelling of ours; difflib's cost grows with length


@functools.lru_cache(maxsize=64)
def _by_length(known: frozenset) -> dict:
    """Length -> the known keys of that length (sorted: difflib's ties go to the first), computed
    once per key list.  Keyed by the set's value and bounded: a caller that builds its set afresh
    each time (a config's own keys) neither misses the cache nor grows it in a long-lived daemon."""
    index: dict = {}
    for k in sorted(known):
        index.setdefault(len(k), []).append(k)
    return index


def suggest(key: str, known: frozenset) -> Optional[str]:
    """The known key ``key`` most likely misspells, or None.

    difflib's ratio 2·M/(a+b) ≥ 0.8 needs the shorter of two names to be at least 2/3 of the
    longer, so only names of such lengths are compared (a third to a tenth of a long list)."""
    if len(key) > _MAX_KEY_LEN:
        return None
    n = len(key)
    index = _by_length(known)
    candidates = [k for length in range(-(-2 * n // 3), 3 * n // 2 + 1) for k in index.get(length, ())]
    hits = difflib.get_close_matches(key, candidates, n=1, cutoff=0.8)
    return hits[0] if hits else None


def check_keys(keys: Iterable[tuple[str, str]], known: frozenset, shape: frozenset, what: str,
               label: str, warnings: list) -> None:
    """Warn about each unknown key ``(raw name, origin)``; stop on a likely misspelt shape key.

    ``what`` names the reader ("GPT-NeoX", "DeepSpeed"). At most MAX_KEY_SUGGESTIONS keys get a
    difflib look-up (each costs ~|known| comparisons); the rest are counted in one warning.
    """
    unknown = 0
    for raw, origin in keys:
        origin = key_origin(origin)         # a written line's key, not its value's variable
        key = raw.replace("-", "_") if isinstance(raw, str) else str(raw)
        if key in known:
            continue
        unknown += 1
        if unknown > MAX_KEY_SUGGESTIONS:
            continue
        guess = suggest(key, known)
        if guess is not None and guess in shape:
            raise CannotPredict(f"{raw!r} is not a {what} key; did you mean {guess!r}? "
                                f"(without it the job would be a different one)", origin)
        hint = f"; did you mean {guess!r}?" if guess else ""
        warnings.append(f"{raw!r} is not a {what} key and is ignored ({origin}){hint}")
    if unknown > MAX_KEY_SUGGESTIONS:
        warnings.append(f"{label}: {unknown - MAX_KEY_SUGGESTIONS} more keys that are not {what} keys")


def check_activation_checkpointing_keys(block: dict, origin: Callable[[str], str], label: str,
                                        warnings: list) -> None:
    """The keys of a DeepSpeed ``activation_checkpointing`` block: each unknown one warned."""
    check_keys(((k, origin(k)) for k in block if isinstance(k, str)), ACTIVATION_CHECKPOINTING_KEYS,
               frozenset(), "DeepSpeed activation_checkpointing", label, warnings)


def check_zero_keys(block: dict, origin: Callable[[str], str], label: str, warnings: list) -> None:
    """The keys of a DeepSpeed ``zero_optimization`` block, wherever it was written (a DeepSpeed
    JSON, a NeoX YAML): a misspelt ``stage`` stops the parse. ``origin(key)`` says where a key is."""
    check_keys(((k, origin(k)) for k in block if isinstance(k, str)), ZERO_KEYS, ZERO_SHAPE_KEYS,
               "DeepSpeed zero_optimization", label, warnings)
    # ZeRO-2 reduces every micro-batch's gradients (predictor.recipe.reduces_every_micro_batch),
    # costed on the compute stream: what overlap_comm hides of them is not modelled, and said so.
    if to_int(block.get("stage")) == 2 and to_bool(block.get("overlap_comm")):
        warnings.append(f"{label}: overlap_comm at ZeRO stage 2 is not modelled: each micro-batch's gradient "
                        f"reduction is costed after its backward, as without it (an upper bound; "
                        f"{origin('overlap_comm')})")


def check_precision_keys(sect: str, block: dict, origin: Callable[[str], str], label: str,
                         warnings: list) -> None:
    """The keys of a DeepSpeed ``fp16`` / ``bf16`` block.  A misspelt ``enabled`` stops the parse:
    DeepSpeed's pydantic configs (extra keys forbidden) refuse it at start, and older releases,
    which read only the keys they know, would train in fp32, another job.  Other unknown keys are
    warnings."""
    known = PRECISION_KEYS[sect]
    if all(k in known for k in block):
        return
    for k in block:
        if k in known or not isinstance(k, str):
            continue
        if "enabled" not in block and suggest(k, frozenset({"enabled"})) is not None:
            raise CannotPredict(f"{k!r} is not a DeepSpeed {sect} key; did you mean 'enabled'? DeepSpeed refuses "
                                f"an unknown {sect} key at start (releases before its pydantic configs ignore it "
                                f"and train without {sect})", key_origin(origin(k)))
    check_keys(((k, origin(k)) for k in block if isinstance(k, str)), known, frozenset(),
               f"DeepSpeed {sect}", label, warnings)


def refuse_choice(what: str, value: Any, accepted: Iterable[str], stops: str, origin: str,
                  choices: str = "") -> NoReturn:
    """Stop the prediction on a value outside a framework's fixed choices, which the framework
    refuses at start-up (``stops`` says how): names the key, the choices (``choices``, else the
    accepted values) and the accepted value nearest to it."""
    names = list(accepted)
    text = value[:40] if isinstance(value, str) else repr(value)[:40]
    near = did_you_mean(text, names) or did_you_mean(text.lower(), names)
    shown = repr(text) if isinstance(value, str) else text
    raise CannotPredict(f"{what} {shown} is not one of {choices or ', '.join(names)}: {stops}{near}", origin)


# DeepSpeed's ZeRO stages: ZeroStageEnum 0-3 of DeepSpeedZeroConfig (runtime/zero/config.py, a
# pydantic model since 0.6, which refuses any other value at start; older releases compare the
# stage with integers and stop on text as well).
ZERO_STAGES = ("0", "1", "2", "3")
_STAGE_WORDS = {"zero": "0", "none": "0", "one": "1", "two": "2", "three": "3"}


def check_zero_stage(value: Any, label: str, origin: str) -> None:
    """A ``zero_optimization.stage`` written as text or a fraction (``"one"``, ``1.5``) stops the
    prediction: DeepSpeed refuses it at start.  An integer is judged by the layout (0-3), an
    unknown shell value or ``"auto"`` (filled by Hugging Face / Accelerate) stays unknown."""
    if isinstance(value, bool) or value is None or to_int(value) is not None:
        return
    if isinstance(value, str) and (MARK_OPEN in value or value.strip() == "auto"):
        return
    if not isinstance(value, (str, int, float)):
        return
    word = _STAGE_WORDS.get(str(value).strip().lower())
    near = f" (did you mean {word}?)" if word else did_you_mean(str(value), ZERO_STAGES)
    raise CannotPredict(f"zero_optimization.stage {str(value)[:30]!r} in {label} is not a ZeRO stage (0, 1, 2 "
                        f"or 3): DeepSpeed's config refuses it and the job stops at start{near}", origin)
