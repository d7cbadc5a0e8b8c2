"""TorchTitan's op-level selective checkpointing: the activations a layer keeps follow the policy
the time model recomputes by (recipe.op_sac_recompute_share).  What torch's checkpoint really keeps
under that policy: tests/calibrate/test_op_sac.py."""
from __future__ import annotations

from dataclasses import replace

import pytest

from predictor import memory as mem
from predictor.job import Layout, ModelSpec

LLAMA8B = ModelSpec(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, seq_len=8192, vocab=128256,
                    activation="swiglu", norm="rmsnorm", attention="flash", pos_emb="rotary")


def _lay(recompute: str, **kw) -> Layout:
    base = dict(pp=1, tp=1, dp=8, micro_batch=1, micro_batches=1, zero_stage=3, recompute=recompute)
    base.update(kw)
    return Layout(**base)


@pytest.mark.parametrize("model", [LLAMA8B, replace(LLAMA8B, activation="gelu", norm="layernorm", ffn_hidden=16384)])
def test_op_sac_keeps_less_than_none_and_more_than_full(model):
    def layer(recompute):
        return mem.layer_activation_bytes(model, _lay(recompute), "bf16", framework="torchtitan")
    assert layer("full") < layer("selective") < layer("none")


def test_bytes_per_token_of_a_small_gated_layer():
    e, h, a, kv, d, f = 2, 256, 4, 2, 64, 512
    model = ModelSpec(layers=2, hidden=h, heads=a, kv_heads=kv, ffn_hidden=f, seq_len=128, vocab=1024,
                      activation="swiglu", norm="rmsnorm", attention="flash", pos_emb="rotary")
    lay = _lay("selective", micro_batch=2)
    tokens = 2 * 128
    # Kept per token: the layer's input (h); of the matmuls wq, wk, wv, wo, w1, w3, w2 the odd ones'
    # outputs: Q (a·d), V (kv·d), w1's gate (f), w2's output (h); SDPA's output (a·d) and its fp32
    # log-sum-exp (one per head).  wk, wo and w3 are recomputed, as are norms, rotary, SwiGLU, adds.
    per_token = e * (h + a * d + kv * d + f + h + a * d) + 4 * a
    got = mem.layer_activation_bytes(model, lay, "bf16", framework="torchtitan")
    assert got == pytest.approx(tokens * per_token, rel=1e-12)
    # A GELU MLP's matmuls are up (fifth, kept: f wide) and down (sixth, recomputed).
    gelu = replace(model, activation="gelu", norm="layernorm")
    per_token_gelu = e * (h + a * d + kv * d + a * d + f) + 4 * a
    got = mem.layer_activation_bytes(gelu, lay, "bf16", framework="torchtitan")
    assert got == pytest.approx(tokens * per_token_gelu, rel=1e-12)


def test_megatron_selective_is_unchanged_and_op_sac_rebuilds_one_layer():
    lay = _lay("selective")
    megatron = mem.layer_activation_bytes(LLAMA8B, lay, "bf16", framework="megatron")
    assert megatron == mem.layer_activation_bytes(LLAMA8B, lay, "bf16")
    titan = mem.layer_activation_bytes(LLAMA8B, lay, "bf16", framework="torchtitan")
    assert titan < megatron
    # The stage holds every layer's kept tensors, and during one layer's backward what that layer
    # recomputes (its none-recompute activations less what it kept).
    layers = LLAMA8B.layers
    none = mem.layer_activation_bytes(LLAMA8B, lay, "bf16", recompute="none")
    stage = mem.stage_activation_bytes(LLAMA8B, lay, "bf16", 0, framework="torchtitan")
    # (the embedding, head and loss are the same without recomputation)
    no_recompute = mem.stage_activation_bytes(LLAMA8B, _lay("none"), "bf16", 0, framework="torchtitan")
    assert stage - no_recompute == pytest.approx(layers * titan + (none - titan) - layers * none, rel=1e-12)


def test_sequence_parallel_shards_the_input_and_keeps_the_reduce_scatters():
    tp = _lay("selective", tp=4, dp=2, sequence_parallel=True)
    plain = _lay("selective", tp=4, dp=2)
    e, tokens, h = 2, LLAMA8B.seq_len, LLAMA8B.hidden
    with_sp = mem.layer_activation_bytes(LLAMA8B, tp, "bf16", framework="torchtitan")
    without = mem.layer_activation_bytes(LLAMA8B, plain, "bf16", framework="torchtitan")
    # The input shrinks to 1/tp of the tokens; the two reduce-scatters' outputs (1/tp each) are kept.
    assert with_sp - without == pytest.approx(e * tokens * h * (1 / 4 - 1) + 2 * e * tokens * h / 4, rel=1e-12)

