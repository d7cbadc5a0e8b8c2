"""The config keys of MosaicML llm-foundry and Composer that the llm-foundry reader checks against.

Data, not code. Sources (read, not copied):

* top level: the fields of ``TrainConfig`` in mosaicml/llm-foundry ``llmfoundry/utils/config_utils.py``
  at commit 0081bd28c39839053cc6e494c570630183a3998c; ``make_dataclass_and_log_config`` there raises
  ``ValueError: Unused parameter KEY found in cfg`` for any other top-level key, so the job stops at
  start.  ``tp_config``, ``accumulate_train_batch_on_tokens`` and ``spin_dataloaders`` are fields of
  later releases, kept so that their configs are not refused;
* ``model:`` (``name: mpt_causal_lm``): the arguments of ``MPTConfig.__init__`` in
  ``llmfoundry/models/mpt/configuration_mpt.py`` at commit 0085285a957badb20c34a462551d25aa5c0a5fc1,
  plus the keys llm-foundry's model builder takes out before it (``name``, ``loss_fn``,
  ``pretrained``, ``pretrained_model_name_or_path``, ``activation_checkpointing_target``,
  ``init_config``).  ``MPTConfig`` passes any other keyword to Hugging Face's ``PretrainedConfig``,
  which keeps it silently: a misspelt ``n_layer: 48`` trains the default 24 layers;
* ``model.attn_config``: ``attn_config_defaults`` in ``llmfoundry/models/utils/config_defaults.py``
  (same repository) plus ``kv_n_heads`` and the older ``prefix_lm``; unknown keys are kept silently;
* ``fsdp_config``: the fields of Composer's ``FSDPConfig`` (mosaicml/composer
  ``composer/utils/parallelism.py`` at commit 008dac709c5da87a4d3e425fea6743c992fc5331), whose
  constructor sets any keyword without a check, plus ``device_mesh`` (Composer < 0.24; refused by
  later releases).
"""
from __future__ import annotations

TRAIN_CONFIG_KEYS = frozenset("""
model tokenizer optimizer scheduler train_loader device_train_batch_size device_eval_batch_size max_duration
eval_interval max_seq_len seed precision code_paths max_split_size_mb expandable_segments cuda_load_lazy
dist_timeout fsdp_config eval_loader eval_loaders icl_tasks icl_tasks_str eval_gauntlet eval_gauntlet_str
icl_subset_num_batches icl_seq_len loggers progress_bar log_to_console python_log_level console_log_interval
log_config callbacks algorithms save_folder save_latest_filename save_overwrite save_weights_only save_filename
save_interval save_num_checkpoints_to_keep load_path load_weights_only load_strict_model_weights load_ignore_keys
save_ignore_keys device_train_microbatch_size global_train_batch_size eval_subset_num_batches eval_first
compile_config metadata run_name autoresume profiler variables n_gpus device_train_grad_accum
tp_config accumulate_train_batch_on_tokens spin_dataloaders
""".split())

MPT_MODEL_KEYS = frozenset("""
name d_model n_heads n_layers expansion_ratio max_seq_len vocab_size resid_pdrop residual_modification
residual_coeff emb_pdrop learned_pos_emb attn_config ffn_config init_device logit_scale no_bias
embedding_fraction norm_type use_cache init_config fc_type tie_word_embeddings use_pad_tok_in_ffn
loss_fn pretrained pretrained_model_name_or_path activation_checkpointing_target verbose norm_eps
""".split())

ATTN_CONFIG_KEYS = frozenset("""
attn_type attn_pdrop attn_impl qk_ln qk_gn fused_qkv clip_qkv softmax_scale attn_uses_sequence_id
sliding_window_size attn_logit_softcapping alibi alibi_bias_max rope rope_theta rope_impl rope_dail_config
rope_hf_config kv_dim kv_n_heads prefix_lm
""".split())

FFN_CONFIG_KEYS = frozenset("""
ffn_type ffn_hidden_size ffn_act_fn fc_type bias moe_num_experts moe_top_k moe_jitter_eps moe_loss_weight
moe_normalize_expert_weights moe_weight_parallelism uniform_expert_assignment
""".split())

FSDP_CONFIG_KEYS = frozenset("""
activation_checkpointing activation_checkpointing_reentrant activation_cpu_offload auto_wrap
te_checkpoint_wrapper te_shard_fp8_weight backward_prefetch backward_prefetch_limit cpu_offload
data_parallel_shard_degree data_parallel_replicate_degree forward_prefetch forward_prefetch_limit
ignored_modules keep_low_precision_grads limit_all_gathers load_monolith_rank0_only load_planner
mixed_precision process_group save_planner sharded_ckpt_prefix_dir sharding_strategy state_dict_type
sync_module_states use_orig_params verbose device_mesh
""".split())

#: The keys the reader uses, by section ("" = the top level): a likely misspelling of one of them
#: stops the prediction (the job would be another one).
READ_KEYS = {
    "": frozenset("""model max_duration eval_interval max_seq_len precision fsdp_config eval_loader
                     save_folder save_interval device_train_microbatch_size global_train_batch_size
                     eval_subset_num_batches variables tp_config""".split()),
    "model": frozenset("""name d_model n_heads n_layers expansion_ratio max_seq_len vocab_size learned_pos_emb
                          attn_config ffn_config norm_type fc_type tie_word_embeddings""".split()),
    "attn_config": frozenset("attn_type attn_impl alibi rope kv_n_heads sliding_window_size".split()),
    "ffn_config": frozenset("ffn_type ffn_hidden_size moe_num_experts".split()),
    "fsdp_config": frozenset("""activation_checkpointing sharding_strategy mixed_precision
                                data_parallel_shard_degree data_parallel_replicate_degree""".split()),
}
