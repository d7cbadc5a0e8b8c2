"""The memory model against figures derived by hand from the published papers.

Every expected number below is written out as a literal and derived in the comment beside it, so
a reader can check it with a pocket calculator against the paper it cites — the test fails if the
module drifts from the paper, not merely from itself.
"""
from __future__ import annotations

import pytest

from predictor import memory as mem
from predictor.job import Layout, ModelSpec

GB = 1e9


# ----------------------------------------------------------------------------- ZeRO paper
# Rajbhandari et al. 2020, Fig. 1 / Sec. 5: Ψ = 7.5 B, Nd = 64, mixed-precision Adam (K = 12).
@pytest.mark.parametrize("stage, expected_gb", [
    (0, 120.0),     # (2 + 2 + 12) · 7.5e9          = 120 GB
    (1, 31.4),      # 4 · 7.5e9 + 12 · 7.5e9 / 64   = 30 + 1.406 = 31.4 GB
    (2, 16.6),      # 2 · 7.5e9 + 14 · 7.5e9 / 64   = 15 + 1.641 = 16.6 GB
    (3, 1.9),       # 16 · 7.5e9 / 64               = 1.875 GB
])
def test_zero_paper_model_states(stage, expected_gb):
    got = mem.model_states_bytes(7.5e9, dp=64, zero_stage=stage, precision="fp16") / GB
    assert got == pytest.approx(expected_gb, abs=0.05)


def test_fp32_adam_is_also_16_bytes_per_parameter():
    # 4 (weight) + 4 (gradient) + 8 (momentum, variance): no master copy.
    assert mem.model_states_bytes(1e9, dp=1, zero_stage=0, precision="fp32") == 16e9


def test_estimate_shards_model_states_like_the_zero_paper():
    # A 7.5B-class model on 64 GPUs, pp = tp = 1: the estimate's states equal the paper's formula
    # for the parameters the model really has.
    m = ModelSpec(layers=40, hidden=4096, heads=32, seq_len=1024, vocab=51200)
    for stage in range(4):
        lay = Layout(pp=1, tp=1, dp=64, micro_batch=1, micro_batches=1, zero_stage=stage,
                     recompute="full")
        est = mem.estimate(m, lay, "fp16")
        psi = est.parameters
        extra = 2 * 2 * mem.layer_parameters(m) if stage == 3 else 0   # ZeRO-3 prefetch
        assert est.model_states == pytest.approx(mem.model_states_bytes(psi, 64, stage) + extra)
    assert 7.9e9 < psi < 8.3e9


# ----------------------------------------------------------------------------- parameter counts
def test_gpt_neox_20b_parameter_count_is_exact():
    # Black et al. 2022: GPT-NeoX-20B has 20,554,567,680 parameters: 44 layers of
    # 12h² + 13h (h = 6144), untied input and output embeddings of 50432 × 6144, final LayerNorm.
    m = ModelSpec(layers=44, hidden=6144, heads=64, seq_len=2048, vocab=50432,
                  tied_embeddings=False, parallel_residual=True)
    lay = Layout(pp=1, tp=1, dp=1)
    assert mem.stage_parameters(m, lay, 0) == 20_554_567_680


def test_gpt3_175b_parameter_count():
    # Brown et al. 2020: 175 B (96 layers, h = 12288); 12h²·96 + embeddings ≈ 174.6 B.
    m = ModelSpec(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=50257)
    total = mem.stage_parameters(m, Layout(pp=1, tp=1, dp=1), 0)
    assert total == pytest.approx(175e9, rel=0.01)


def test_tensor_and_pipeline_split_parameters():
    # vocab 51200 needs no padding at tp = 4 (a multiple of 512), so only replication differs.
    m = ModelSpec(layers=44, hidden=6144, heads=64, seq_len=2048, vocab=51200, tied_embeddings=False)
    whole = mem.stage_parameters(m, Layout(), 0)
    lay = Layout(pp=4, tp=4, dp=8)
    split = sum(mem.stage_parameters(m, lay, s) for s in range(4)) * 4
    # Only replicated norms and row-parallel biases are counted four times.
    replicated = 44 * (2 * 6144 + 2 * 2 * 6144) + 2 * 6144
    assert split - whole == pytest.approx(3 * replicated, rel=1e-9)


def test_vocab_padding_follows_gpt_neox():
    assert mem.padded_vocab(50257, 1) == 50304          # next multiple of 128
    assert mem.padded_vocab(50257, 4) == 50688          # next multiple of 512
    assert mem.padded_vocab(51200, 8) == 51200


# ----------------------------------------------------------------------------- Korthikanti et al.
# Table 3 of Korthikanti et al. 2022 (s = 2048): GPT-3 175B h = 12288, a = 96, L = 96, t = 8,
# p = 8; 530B h = 20480, a = 128, L = 105, t = 8, p = 35; 1T h = 25600, a = 160, L = 128, t = 8,
# p = 64; micro-batch 1; 22B h = 6144, a = 64, L = 48, t = 8, p = 1, micro-batch 4.
GPT175 = ModelSpec(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200)
GPT530 = ModelSpec(layers=105, hidden=20480, heads=128, seq_len=2048, vocab=51200)
GPT1T = ModelSpec(layers=128, hidden=25600, heads=160, seq_len=2048, vocab=51200)
GPT22 = ModelSpec(layers=48, hidden=6144, heads=64, seq_len=2048, vocab=51200)


def _lay(pp, tp, mb=1, recompute="none", sp=False, m=None):
    return Layout(pp=pp, tp=tp, dp=1, micro_batch=mb, micro_batches=m or max(pp, 1),
                  recompute=recompute, sequence_parallel=sp, zero_stage=0)


@pytest.mark.parametrize("model, pp, recompute, sp, per_layer", [
    # 175B, sbh = 2048·12288 = 25,165,824
    (GPT175, 8, "none", False, 578_813_952),       # sbh·(10 + 24/8 + 5·96·2048/(12288·8)) = 23 sbh
    (GPT175, 8, "none", True, 358_612_992),        # sbh/8·(34 + 5·96·2048/12288) = 14.25 sbh
    (GPT175, 8, "selective", False, 327_155_712),  # sbh·(10 + 24/8) = 13 sbh
    (GPT175, 8, "selective", True, 106_954_752),   # sbh·34/8 = 4.25 sbh
    (GPT175, 8, "full", False, 50_331_648),        # 2 sbh
    (GPT175, 8, "full", True, 6_291_456),          # 2 sbh / 8
    # 530B, sbh = 2048·20480 = 41,943,040
    (GPT530, 35, "none", False, 880_803_840),      # sbh·(10 + 3 + 5·128·2048/(20480·8)) = 21 sbh
    (GPT530, 35, "selective", True, 178_257_920),  # 4.25 sbh
    # 1T, sbh = 2048·25600 = 52,428,800
    (GPT1T, 64, "none", False, 1_101_004_800),     # sbh·(10 + 3 + 5·160·2048/(25600·8)) = 21 sbh
    (GPT1T, 64, "selective", True, 222_822_400),   # 4.25 sbh
])
def test_korthikanti_per_layer_activations(model, pp, recompute, sp, per_layer):
    lay = _lay(pp, 8, recompute=recompute, sp=sp)
    assert mem.layer_activation_bytes(model, lay, "fp16") == pytest.approx(per_layer, rel=1e-12)


def test_korthikanti_first_stage_totals():
    # First stage of 1F1B holds p micro-batches of L/p layers = L layers' worth, plus the
    # embedding dropout mask s·b·h·p (÷t with sequence parallelism).
    # 175B, TP only, no recompute: 96 · 23 sbh + 8 sbh = 55,566,139,392 + 201,326,592
    est = mem.stage_activation_bytes(GPT175, _lay(8, 8), "fp16", 0)
    assert est == pytest.approx(55_767_465_984)
    # 175B, TP + SP + selective (the paper's recommended setting): 96 · 4.25 sbh + 8 sbh / 8
    est = mem.stage_activation_bytes(GPT175, _lay(8, 8, recompute="selective", sp=True), "fp16", 0)
    assert est == pytest.approx(10_292_822_016)           # 10.29 GB, vs 55.8 GB above: ~5x
    # 530B, TP only, no recompute: 105 · 21 sbh + 35 sbh = 92,484,403,200 + 1,468,006,400 —
    # over the 80 GB of an A100, which is the paper's motivation.
    est = mem.stage_activation_bytes(GPT530, _lay(35, 8), "fp16", 0)
    assert est == pytest.approx(93_952_409_600)
    # 530B, TP + SP + selective: 105 · 4.25 sbh + 35 sbh / 8 = 18,717,081,600 + 183,500,800
    est = mem.stage_activation_bytes(GPT530, _lay(35, 8, recompute="selective", sp=True), "fp16", 0)
    assert est == pytest.approx(18_900_582_400)
    # 1T, TP + SP + selective: 128 · 4.25 sbh + 64 sbh / 8 = 28,521,267,200 + 419,430,400
    est = mem.stage_activation_bytes(GPT1T, _lay(64, 8, recompute="selective", sp=True), "fp16", 0)
    assert est == pytest.approx(28_940_697_600)


def test_full_recompute_first_stage_adds_one_rebuilt_layer():
    # 175B, TP only, full: 96 layer inputs of 2 sbh, the one layer rebuilt in backward (23 sbh)
    # and the embedding mask 8 sbh: (192 + 23 + 8) · 25,165,824.
    est = mem.stage_activation_bytes(GPT175, _lay(8, 8, recompute="full"), "fp16", 0)
    assert est == pytest.approx(223 * 25_165_824)


def test_22b_no_pipeline_last_stage_terms():
    # 22B, t = 8, p = 1, b = 4: sbh = 2048·4·6144 = 50,331,648; per layer
    # sbh·(10 + 3 + 5·64·2048/(6144·8)) = 26.333 sbh; one micro-batch in flight; embedding mask
    # sbh; final-norm and head inputs 2·2 sbh (replicated without SP); Korthikanti's fp32 logits
    # 4·s·b·V/t = 4·8192·51200/8 = 209,715,200, and beside them at the loss's peak the fp16 logits
    # the head wrote, 2·8192·51200/8 = 104,857,600 (Megatron's loss works in place in the copy).
    sbh = 50_331_648
    expected = 48 * sbh * (13 + 40 / 3) + sbh + 4 * sbh + 209_715_200 + 104_857_600
    est = mem.stage_activation_bytes(GPT22, _lay(1, 8, mb=4), "fp16", 0, framework="megatron")
    assert est == pytest.approx(expected, rel=1e-12)
    # PyTorch's cross entropy (TorchTitan, or a job naming no framework) writes its log-softmax
    # to a second fp32 buffer: 4·8192·51200/8 more.
    for framework in ("torchtitan", ""):
        other = mem.stage_activation_bytes(GPT22, _lay(1, 8, mb=4), "fp16", 0, framework=framework)
        assert other - est == pytest.approx(209_715_200, rel=1e-12)


@pytest.mark.parametrize("precision, framework, bytes_per_logit", [
    ("bf16", "megatron", 6),      # 16-bit logits + fp32 copy, softmax in place (Megatron-core)
    ("bf16", "neox", 6),          # GPT-NeoX's mpu cross entropy: the same in-place arithmetic
    ("bf16", "torchtitan", 10),   # + F.cross_entropy's fp32 log-softmax output
    ("fp32", "megatron", 4),      # fp32 logits are their own copy
    ("fp32", "torchtitan", 8),
])
def test_loss_bytes_per_logit(precision, framework, bytes_per_logit):
    # s = 4096, b = 2, cp = 2: 4096 tokens per rank; vocab 50257 padded to 50688 at t = 4.
    m = ModelSpec(layers=2, hidden=1024, heads=8, seq_len=4096, vocab=50257)
    lay = Layout(tp=4, cp=2, micro_batch=2)
    assert mem.loss_bytes(m, lay, precision, framework) == bytes_per_logit * 4096 * 50688 / 4


def test_interleaved_first_stage_holds_l_times_one_plus_p_minus_1_over_pv():
    # Korthikanti Sec. 4.2.3: L·(1 + (p − 1)/(p·v)); p = 4, v = 2, L = 48 → 66 layers' worth.
    lay = Layout(pp=4, tp=8, dp=1, micro_batch=1, micro_batches=8, recompute="selective",
                 sequence_parallel=True, virtual_stages=2, zero_stage=0)
    per_layer = mem.layer_activation_bytes(GPT22, lay, "fp16")
    layers = mem.in_flight(lay, 0) * mem.stage_layers(GPT22, lay)[0]
    assert layers == pytest.approx(66)
    act = mem.stage_activation_bytes(GPT22, lay, "fp16", 0)
    assert act == pytest.approx(66 * per_layer + mem.in_flight(lay, 0) * 2048 * 6144 / 8)


def test_in_flight_micro_batches_of_1f1b():
    lay = Layout(pp=4, micro_batches=16)
    assert [mem.in_flight(lay, r) for r in range(4)] == [4, 3, 2, 1]
    few = Layout(pp=8, micro_batches=3)
    assert mem.in_flight(few, 0) == 3
    assert mem.in_flight(Layout(pp=1, micro_batches=64), 0) == 1


# ----------------------------------------------------------------------------- generalisations
def test_gqa_and_swiglu_change_only_their_tensors():
    base = ModelSpec(layers=32, hidden=4096, heads=32, seq_len=4096)
    lay = _lay(1, 1, recompute="selective")
    sbh = 4096 * 4096
    assert mem.layer_activation_bytes(base, lay, "bf16") == 34 * sbh
    gqa = ModelSpec(layers=32, hidden=4096, heads=32, kv_heads=8, seq_len=4096)
    # K and V shrink from h to h/4 wide: 2·2·(1 − 1/4) sbh = 3 sbh saved.
    assert mem.layer_activation_bytes(gqa, lay, "bf16") == 31 * sbh
    swiglu = ModelSpec(layers=32, hidden=4096, heads=32, seq_len=4096, activation="swiglu",
                       ffn_hidden=11008)
    # MLP tensors: gate+up (2f) and down input (f) at 2 bytes instead of 2 × 4h.
    expected = (34 - 16) * sbh + 2 * 4096 * 3 * 11008
    assert mem.layer_activation_bytes(swiglu, lay, "bf16") == expected


def test_flash_attention_keeps_no_scores():
    fused = ModelSpec(layers=24, hidden=2048, heads=16, seq_len=2048)
    flash = ModelSpec(layers=24, hidden=2048, heads=16, seq_len=2048, attention="flash")
    none, sel = _lay(1, 1), _lay(1, 1, recompute="selective")
    assert mem.layer_activation_bytes(flash, none, "fp16") == mem.layer_activation_bytes(flash, sel, "fp16")
    assert mem.layer_activation_bytes(fused, none, "fp16") > 2 * mem.layer_activation_bytes(flash, none, "fp16")


def test_fp32_doubles_tensors_not_masks():
    lay = _lay(1, 1)
    sbh = 2048 * 12288
    s2 = 96 * 2048 * 2048
    # 32 sbh of 2-byte tensors + 2 sbh of masks; 4 as²b of tensors + as²b of mask.
    assert mem.layer_activation_bytes(GPT175, lay, "fp16") == 34 * sbh + 5 * s2
    assert mem.layer_activation_bytes(GPT175, lay, "fp32") == 66 * sbh + 9 * s2


def test_last_stage_can_be_the_worst():
    # A small model with a huge vocabulary: the fp32 logits on the last stage dominate.
    m = ModelSpec(layers=8, hidden=1024, heads=16, seq_len=4096, vocab=256_000)
    lay = Layout(pp=4, tp=1, dp=1, micro_batch=4, micro_batches=8, recompute="full", zero_stage=0)
    est = mem.estimate(m, lay, "bf16")
    assert est.stage == 3
    assert est.total > mem._stage_estimate(m, lay, "bf16", 0).total


def test_fits_uses_total_with_reserve():
    m = ModelSpec(layers=44, hidden=6144, heads=64, seq_len=2048, vocab=50257)
    lay = Layout(pp=4, tp=4, dp=8, micro_batch=4, micro_batches=16, recompute="full", zero_stage=1)
    est = mem.estimate(m, lay, "fp16")
    assert est.reserve >= mem.RESERVE_FIXED_BYTES
    assert est.fits(80) and not est.fits(est.total_gib * 0.99)
    d = est.to_dict()
    assert d["total_gib"] == pytest.approx(est.total_gib, abs=1e-3)


# ----------------------------------------------------------------------------- optimizer step
def test_sixteen_bit_gradients_are_stepped_as_an_fp32_copy_of_the_shard():
    # Short sequences under full recompute: a few MB of activations against a GB-sized copy.
    m = ModelSpec(layers=24, hidden=2048, heads=16, seq_len=256, vocab=50304)
    for dp, zero in ((1, 0), (8, 1), (8, 2), (8, 3)):
        lay = Layout(dp=dp, micro_batch=1, micro_batches=4, recompute="full", zero_stage=zero)
        est = mem.estimate(m, lay, "fp16", "fp16", "deepspeed")
        shard = dp if zero >= 1 else 1
        assert est.optimizer_step == pytest.approx(4 * est.parameters / shard)
        assert est.activations < est.optimizer_step
        # The peak holds the copy instead of the (freed) activations, not both.
        assert est.formula_bytes == pytest.approx(est.model_states + est.optimizer_step)
        assert est.total == pytest.approx(est.formula_bytes + est.reserve)
        assert est.to_dict()["optimizer_step_gib"] == pytest.approx(est.optimizer_step / mem.GIB, abs=1e-3)


def test_fp32_gradients_need_no_copy_and_long_sequences_peak_in_the_backward():
    m = ModelSpec(layers=24, hidden=2048, heads=16, seq_len=256, vocab=50304)
    lay = Layout(dp=1, micro_batch=1, micro_batches=4, recompute="full", zero_stage=1)
    # Megatron's bf16 default keeps fp32 gradients (18 bytes per parameter) and steps on them.
    meg = mem.estimate(m, lay, "bf16", "fp32", "megatron")
    assert meg.optimizer_step == 0 and meg.formula_bytes == meg.model_states + meg.activations
    assert mem.estimate(m, lay, "fp32").optimizer_step == 0
    # With 8k tokens and no recompute the activations outgrow the copy: they set the peak.
    long = ModelSpec(layers=24, hidden=2048, heads=16, seq_len=8192, vocab=50304, attention="flash")
    est = mem.estimate(long, Layout(dp=1, micro_batch=1, recompute="none", zero_stage=1), "bf16", "bf16",
                       "deepspeed")
    assert est.activations > est.optimizer_step > 0
    assert est.formula_bytes == pytest.approx(est.model_states + est.activations)


def test_deepspeed_bf16_optimizer_keeps_bf16_and_fp32_gradients_and_partitions_the_rest():
    # DeepSpeed's bf16 engine without ZeRO accumulates in fp32 and runs BF16_Optimizer: bf16
    # weights 2, bf16 gradients 2, an fp32 gradient buffer of the whole model 4, and the fp32
    # master weights and moments (12) over the 8 data-parallel ranks: 8 + 12/8 = 9.5 bytes each.
    m = ModelSpec(layers=24, hidden=2048, heads=16, seq_len=256, vocab=50304)
    lay = Layout(dp=8, micro_batch=1, micro_batches=4, recompute="full", zero_stage=0)
    est = mem.estimate(m, lay, "bf16", "bf16", "deepspeed")
    assert mem.deepspeed_bf16_optimizer("bf16", lay, "deepspeed", "bf16")
    assert est.model_states == pytest.approx(9.5 * est.parameters)
    assert est.optimizer_step == 0                       # it steps on its fp32 gradients
    # ZeRO-1 takes the ZeRO optimizer unless the gradients are fp32; fp16 never takes it, nor
    # Megatron's own optimizer.
    z1 = Layout(dp=8, micro_batch=1, micro_batches=4, recompute="full", zero_stage=1)
    assert mem.deepspeed_bf16_optimizer("bf16", z1, "deepspeed", "fp32")
    assert not mem.deepspeed_bf16_optimizer("bf16", z1, "deepspeed", "bf16")
    assert not mem.deepspeed_bf16_optimizer("fp16", lay, "deepspeed", "fp16")
    assert not mem.deepspeed_bf16_optimizer("bf16", lay, "megatron", "fp32")
    zero1 = mem.estimate(m, z1, "bf16", "bf16", "deepspeed")
    assert zero1.model_states == pytest.approx((2 + 2 + 12 / 8) * zero1.parameters)
