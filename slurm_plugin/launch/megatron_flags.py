"""The command-line flags Megatron's argparse knows, as data for catching misspelt flags (megatron.py).

Megatron-LM: every option string added by ``add_megatron_arguments`` in
``megatron/training/arguments.py`` of NVIDIA/Megatron-LM at commit 000c4ac2 (2025, the Megatron-core
0.14/0.15 line), including both spellings of ``argparse.BooleanOptionalAction`` flags. Its parser is
built with ``allow_abbrev=False``, so a prefix of a flag is refused like any unknown flag.

Older spellings and Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed, bigscience's fork) add flags of
their own; those that batch scripts in use carry are in :data:`OLDER_AND_FORKS`, so that they are not
called misspellings. DeepSpeed's ``add_config_arguments`` and the launchers add :data:`LAUNCHER`.
A training script may add flags of its own (``extra_args_provider``), which no list can hold.
"""
from __future__ import annotations

MEGATRON_LM_SOURCE = "NVIDIA/Megatron-LM megatron/training/arguments.py @ 000c4ac2 (2025)"

_MEGATRON_LM = """
account-for-embedding-in-pipeline-split account-for-loss-in-pipeline-split accumulate-allreduce-grads-in-fp32
activation-func-clamp-value adam-beta1 adam-beta2 adam-eps add-qkv-bias adlr-autoresume
adlr-autoresume-interval allow-ambiguous-pad-tokens app-tag-run-name app-tag-run-version apply-layernorm-1p
apply-query-key-layer-scaling apply-residual-connection-post-layernorm async-save attention-backend
attention-dropout attention-softmax-in-fp32 auto-detect-ckpt-format batch-size bert-embedder-type bert-load
bert-no-binary-head bf16 biencoder-projection-dim biencoder-shared-query-context-model block-data-path
cache-mla-latents calc-ft-timeouts calculate-per-token-loss check-for-large-grads check-for-spiky-loss
check-weight-hash-across-dp-replicas-interval checkpoint-activations ckpt-assume-constant-structure
ckpt-convert-format ckpt-convert-save ckpt-convert-update-legacy-dist-opt-format ckpt-format
ckpt-fully-parallel-load ckpt-fully-parallel-save ckpt-step classes-fraction clip-grad config-logger-dir
context-parallel-size cp-comm-type cpu-offloading-num-layers cross-entropy-fusion-impl
cross-entropy-loss-fusion cuda-graph-impl cuda-graph-scope cuda-graph-warmup-steps data-args-path
data-cache-path data-parallel-random-init data-parallel-sharding-strategy data-path data-per-class-fraction
dataloader-type ddp-average-in-collective ddp-bucket-size ddp-num-buckets ddp-pad-buckets-for-high-nccl-busbw
ddp-reduce-scatter-with-fp32-accumulation decode-only-cuda-graphs decoder-first-pipeline-num-layers
decoder-last-pipeline-num-layers decoder-num-layers decoder-seq-length decoupled-lr decoupled-min-lr
decrease-batch-size-if-needed defer-embedding-wgrad-compute delay-wgrad-compute deterministic-mode
dino-bottleneck-size dino-freeze-last-layer dino-head-hidden-size dino-local-crops-number dino-local-img-size
dino-norm-last-layer dino-teacher-temp dino-warmup-teacher-temp dino-warmup-teacher-temp-epochs
disable-bf16-reduced-precision-matmul disable-bias-linear disable-chunked-prefill disable-gloo-process-groups
disable-straggler-on-startup disable-symmetric-registration disable-tp-comm-bulk-dgrad
disable-tp-comm-bulk-wgrad disable-tp-comm-overlap-ag disable-tp-comm-overlap-rs disable-tp-comm-split-ag
disable-tp-comm-split-rs dist-ckpt-format dist-ckpt-optim-fully-reshardable dist-ckpt-save-pre-mcore-014
dist-ckpt-strictness distrib-optim-fully-reshardable-mem-efficient distribute-saved-activations
distributed-backend distributed-timeout-minutes distributed-timeout-seconds-after-init
dump-param-to-param-group-map embedding-init-method-std embedding-path empty-unused-memory-level
enable-cuda-graph enable-ft-package enable-full-sharding-in-hsdp encoder-num-layers encoder-seq-length
end-weight-decay eod-mask-loss error-injection-rate error-injection-type eval-interval eval-iters
evidence-data-path exit-duration-in-mins exit-interval exit-on-missing-checkpoint exit-signal-handler
expert-model-parallel-size expert-tensor-parallel-size external-cuda-graph ffn-hidden-size finetune
first-last-layers-bf16 flash-decode fp16 fp16-lm-cross-entropy fp32-residual-connection fp4-format
fp4-param-gather fp4-quantizer-factory fp4-recipe fp8-amax-compute-algo fp8-amax-history-len fp8-format
fp8-interval fp8-margin fp8-param-gather fp8-quantizer-factory fp8-recipe fsdp-double-buffer full-validation
global-batch-size glu-linear-offset grad-reduce-in-bf16 group-query-attention grpo-clamp-eps-lower
grpo-clamp-eps-upper grpo-default-temperature grpo-default-top-p grpo-entropy-term-weight
grpo-filter-groups-with-same-reward grpo-group-size grpo-iterations grpo-kl-beta grpo-prompts-per-step
head-lr-mult hidden-dropout hidden-size hierarchical-context-parallel-sizes high-priority-stream-groups
hysteresis ict-head-size ict-load img-h img-w indexer-batch-size indexer-log-interval
inference-batch-times-seqlen-threshold inference-dynamic-batching inference-dynamic-batching-block-size
inference-dynamic-batching-buffer-guaranteed-fraction inference-dynamic-batching-buffer-overflow-factor
inference-dynamic-batching-buffer-size-gb inference-dynamic-batching-max-requests-override
inference-dynamic-batching-max-tokens-override inference-dynamic-batching-num-cuda-graphs
inference-dynamic-batching-track-paused-request-events inference-dynamic-batching-unified-memory-level
inference-max-batch-size inference-max-requests inference-max-seq-length inference-rng-tracker
inference-wandb-logging-step-interval init-method-std init-method-xavier-uniform init-model-with-meta-device
initial-loss-scale inprocess-active-world-size inprocess-barrier-timeout inprocess-completion-timeout
inprocess-empty-cuda-cache inprocess-granularity inprocess-hard-timeout inprocess-heartbeat-interval
inprocess-heartbeat-timeout inprocess-last-call-wait inprocess-max-iterations
inprocess-monitor-process-interval inprocess-monitor-thread-interval inprocess-progress-watchdog-interval
inprocess-restart inprocess-soft-timeout inprocess-termination-grace-time iter-per-epoch iterations-to-skip
keep-fp8-transpose-cache kv-channels kv-lora-rank langrl-env-config langrl-external-server
langrl-inference-server-conversation-template langrl-inference-server-type lazy-mpu-init legacy-tokenizer load
load-main-params-from-ckpt local-rank log-energy log-interval log-memory-to-tensorboard log-num-zeros-in-grad
log-params-norm log-progress log-straggler log-throughput log-timers-to-tensorboard
log-validation-ppl-to-tensorboard log-world-size-to-tensorboard logging-level loss-scale loss-scale-window lr
lr-decay-iters lr-decay-samples lr-decay-style lr-warmup-fraction lr-warmup-init lr-warmup-iters
lr-warmup-samples lr-wsd-decay-iters lr-wsd-decay-samples lr-wsd-decay-style make-vocab-size-divisible-by
manual-gc manual-gc-interval mask-factor mask-prob mask-type max-position-embeddings max-tokens-to-oom
memory-snapshot-path merge-file micro-batch-size microbatch-group-size-per-virtual-pipeline-stage
mid-level-dataset-surplus min-loss-scale min-lr mlp-chunks-for-prefill mock-data model-parallel-size
moe-apply-probs-on-input moe-aux-loss-coeff moe-deepep-num-sms moe-enable-deepep moe-expert-capacity-factor
moe-extended-tp moe-ffn-hidden-size moe-grouped-gemm moe-input-jitter-eps moe-layer-freq moe-layer-recompute
moe-pad-expert-input-to-capacity moe-pad-experts-for-cuda-graph-inference moe-per-layer-logging
moe-permute-fusion moe-router-bias-update-rate moe-router-dtype moe-router-enable-expert-bias
moe-router-force-load-balancing moe-router-fusion moe-router-group-topk moe-router-load-balancing-type
moe-router-num-groups moe-router-padding-for-fp8 moe-router-pre-softmax moe-router-score-function
moe-router-topk moe-router-topk-scaling-factor moe-shared-expert-intermediate-size moe-shared-expert-overlap
moe-token-dispatcher-type moe-token-drop-policy moe-upcycling-granularity moe-use-legacy-grouped-gemm
moe-use-upcycling moe-z-loss-coeff mrope-section mscale mscale-all-dim mtp-loss-scaling-factor mtp-num-layers
multi-latent-attention multiple-validation-sets muon-extra-scale-factor muon-fp32-matmul-prec muon-momentum
muon-no-split-qkv muon-num-ns-steps muon-scale-mode muon-tp-mode muon-use-nesterov nccl-all-reduce-for-prefill
nccl-communicator-config-path no-align-grad-reduce no-align-param-gather
no-async-tensor-model-parallel-allreduce no-barrier-with-level-1-timing no-bias-dropout-fusion
no-bias-gelu-fusion no-bias-swiglu-fusion no-check-for-nan-in-loss-and-grad no-ckpt-fully-parallel-save
no-clone-scatter-output-in-embedding no-create-attention-mask-in-dataloader no-data-sharding no-fp8-wgrad
no-gradient-accumulation-fusion no-gradient-reduce-div-fusion no-initialization no-langrl-external-server
no-load-optim no-load-rng no-log-loss-scale-to-tensorboard no-manual-gc-eval no-masked-softmax-fusion
no-mmap-bin-files no-one-logger no-overlap-p2p-communication no-persist-layer-norm no-pin-cpu-grads
no-pin-cpu-params no-position-embedding no-rl-calculate-intra-group-similarity
no-rl-inference-logprobs-is-correction no-rl-offload-kv-cache-during-training no-rl-partial-rollouts
no-rl-remove-kv-cache-during-training no-rl-reset-cuda-graphs no-rope-freq no-rope-fusion no-save-optim
no-save-rng no-scatter-gather-tensors-in-pipeline no-strict-fsdp-dtensor-load
no-use-tokenizer-model-from-checkpoint-args non-persistent-ckpt-type non-persistent-global-ckpt-dir
non-persistent-local-ckpt-algo non-persistent-local-ckpt-dir non-persistent-save-interval norm-epsilon
normalization num-attention-heads num-channels num-classes num-dataset-builder-threads
num-distributed-optimizer-instances num-experts num-layers num-layers-at-end-in-bf16
num-layers-at-start-in-bf16 num-layers-per-virtual-pipeline-stage num-query-groups
num-virtual-stages-per-pipeline-rank num-workers object-storage-cache-path one-logger-async one-logger-project
one-logger-run-name onnx-safe openai-gelu optimizer optimizer-cpu-offload optimizer-offload-fraction
output-bert-embeddings overlap-cpu-optimizer-d2h-h2d overlap-grad-reduce overlap-moe-expert-parallel-comm
overlap-p2p-communication-warmup-flush overlap-param-gather overlap-param-gather-with-optimizer-step
override-opt-param-scheduler override-opt_param-scheduler padded-vocab-size patch-dim per-split-data-args-path
perform-rl-step persistent-save-interval pipeline-model-parallel-comm-backend pipeline-model-parallel-layout
pipeline-model-parallel-size position-embedding-type pretrained-checkpoint profile profile-ranks
profile-step-end profile-step-start q-lora-rank qk-head-dim qk-l2-norm qk-layernorm qk-pos-emb-head-dim
query-in-block-prob quick-geglu rampup-batch-size recompute-activations recompute-granularity recompute-method
recompute-modules recompute-num-layers record-memory-history relative-attention-max-distance
relative-attention-num-buckets replication replication-factor replication-jump rerun-mode reset-attention-mask
reset-position-ids result-rejected-tracker-filename retriever-report-topk-accuracies retriever-score-scaling
retriever-seq-length retro-add-retriever retro-attention-gate retro-cyclic-train-iters
retro-encoder-attention-dropout retro-encoder-hidden-dropout retro-encoder-layers
retro-no-verify-neighbor-count retro-num-neighbors retro-num-retrieved-chunks retro-project-dir
reuse-grad-buf-for-mxfp8-param-ag rl-calculate-intra-group-similarity rl-importance-sampling-truncation-coef
rl-inference-logprobs-is-correction rl-offload-kv-cache-during-training rl-offload-optimizer-during-inference
rl-partial-rollouts rl-prompts-per-eval rl-remove-kv-cache-during-training rl-reset-cuda-graphs
rl-sequence-packing-algo rl-sequence-packing-bin-size rl-use-sequence-packing rope-scaling-factor rope-type
rotary-base rotary-interleaved rotary-percent rotary-scaling-factor rotary-seq-len-interpolation-factor
run-workload-inspector-server sample-rate save save-interval save-retain-interval seed seq-length
sequence-parallel sgd-momentum sharp-enabled-group short-seq-prob skip-train softmax-type split squared-relu
start-weight-decay straggler-ctrlr-port straggler-minmax-count suggested-communication-unit-size swiglu
swin-backbone-type symmetric-ar-type te-rng-tracker tensor-model-parallel-size tensorboard-dir
tensorboard-log-interval tensorboard-queue-size test-data-path test-mode tiktoken-num-special-tokens
tiktoken-pattern tiktoken-special-tokens timing-log-level timing-log-option titles-data-path
tokenizer-metadata tokenizer-model tokenizer-type torch-fsdp2-no-reshard-after-forward
tp-comm-bootstrap-backend tp-comm-overlap tp-comm-overlap-cfg tp-comm-overlap-rs-dgrad train-data-path
train-iters train-samples train-sync-interval transformer-impl trust-remote-code
untie-embeddings-and-output-weights use-checkpoint-args use-checkpoint-opt-param-scheduler
use-checkpoint-opt_param-scheduler use-cpu-initialization use-dist-ckpt use-distributed-optimizer
use-flash-attn use-fused-weighted-squared-relu use-legacy-models use-legacy-static-engine use-mcore-models
use-megatron-fsdp use-mp-args-from-checkpoint-args use-nccl-ub use-one-sent-docs use-persistent-ckpt-worker
use-pytorch-profiler use-ring-exchange-p2p use-rope-scaling use-rotary-position-embeddings use-sharp
use-te-activation-func use-torch-fsdp2 use-torch-optimizer-for-cpu-offload use-tp-pp-dp-mapping v-head-dim
valid-data-path vision-backbone-type vision-pretraining vision-pretraining-type vocab-extra-ids vocab-file
vocab-size wandb-entity wandb-exp-name wandb-project wandb-save-dir warmup weight-decay
weight-decay-incr-style wgrad-deferral-limit window-attn-skip-freq window-size
"""

_OLDER_AND_FORKS = """
abort-on-unmet-fused-kernel-constraints data-impl embed-layernorm kill-switch-path pad-vocab-size-to
pp-partition-method tokenizer-name-or-path train-tokens use-flash-attn-v1 use-flash-attn-v2 use-flash-attn-triton
zero-stage num-key-value-heads deepspeed-activation-checkpointing no-pipeline-parallel ds-sequence-parallel-size
glu-activation checkpoint-num-layers checkpoint-in-cpu contigious-checkpointing partition-activations
synchronize-each-layer profile-backward cpu-optimizer cpu-torch-adam zero-contigious-gradients
zero-reduce-scatter zero-reduce-bucket-size zero-allgather-bucket-size remote-device use-pin-memory
scattered-embeddings split-transformers memory-centric-tiled-linear tile-factor deepspeed-mpi
curriculum-learning-legacy curriculum-seqlen data-efficiency-curriculum-learning random-ltd
mos kd num-layers-teacher hidden-size-teacher num-attention-heads-teacher load-teacher
moe-expert-parallel-size moe-train-capacity-factor moe-eval-capacity-factor moe-min-capacity
moe-loss-coeff use-tutel create-moe-param-group disable-moe-token-dropping moe-token-dropping
mlp-type topk expert-interval use-rotary-position-embeddings rotary-position-embeddings-theta
no-query-key-layer-scaling use-contiguous-buffers-in-local-ddp no-contiguous-buffers-in-local-ddp
DDP-impl use-checkpoint-lr-scheduler override-lr-scheduler distribute-checkpointed-activations
encoder-tensor-model-parallel-size encoder-pipeline-model-parallel-size pipeline-model-parallel-split-rank
standalone-embedding-stage fp8-e4m3 fp8-hybrid universal-checkpoint log-optimizer-states-to-tensorboard
log-batch-size-to-tensorboard log-learning-rate-to-tensorboard log-loss-scale-to-tensorboard
sequence-parallel-size force-ds-sequence-parallel use-dataset-only
"""

_LAUNCHER = "deepspeed deepspeed_config deepscale deepscale_config deepspeed-config deepspeed_mpi local_rank local-rank"

MEGATRON_LM = frozenset("--" + f for f in _MEGATRON_LM.split())
OLDER_AND_FORKS = frozenset("--" + f for f in _OLDER_AND_FORKS.split())
LAUNCHER = frozenset("--" + f for f in _LAUNCHER.split())
KNOWN = MEGATRON_LM | OLDER_AND_FORKS | LAUNCHER
