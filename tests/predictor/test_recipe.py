import pytest

from predictor import TrainingJob
from predictor.recipe import (_group, gated_ffn_width, groups, layer_parameters, model_flops_per_iteration,
                              padded_vocab, stage_layers, stage_parameter_counts, total_parameters,
                              vocab_per_rank)

from .conftest import GPT20B, make_job


def test_vocab_padding_eq1_eq2():
    assert padded_vocab(50257, 1) == 50304
    assert padded_vocab(50257, 4) == 50688 and vocab_per_rank(50257, 4) == 12672
    assert vocab_per_rank(50257, 8) == 6400


def _split(layers, pp, v=1, **layout):
    model = dict(GPT20B, layers=layers)
    return stage_layers(make_job(model=model, pp=pp, tp=1, dp=1, virtual_stages=v,
                                 micro_batches=max(pp, 1), **layout))


def test_stage_split_matches_paper_eq3_5():
    # The paper's Eq. 3–5 is DeepSpeed's 'uniform' method: (L + 5) items split uniformly, the
    # embedding + hook on the first stage, three items on the last.
    uniform = {"pipe_split": "deepspeed_uniform"}
    assert _split(44, 4, **uniform) == [11, 12, 12, 9]
    assert _split(32, 4, **uniform) == [8, 9, 9, 6]
    assert _split(40, 4, **uniform) == [10, 11, 11, 8]


def test_neox_default_split_is_deepspeed_balanced_type_transformer():
    # GPT-NeoX's type:transformer|mlp weighs the two hooks too (46 units for 44 layers);
    # DeepSpeed's partition_balanced evens them out as 12, 12, 11, 11 units.
    assert _split(44, 4) == [11, 12, 11, 10]
    assert _split(40, 4) == [10, 11, 10, 9]
    assert _split(44, 8) == [5, 6, 6, 6, 6, 6, 5, 4]


def test_stage_split_sums_and_small_pp():
    for layers in (2, 7, 24, 44, 45, 80, 96):
        for pp in (1, 2, 3, 4, 8):
            if layers >= pp:
                for rule in ("neox", "deepspeed_uniform", "deepspeed_parameters"):
                    s = _split(layers, pp, pipe_split=rule)
                    assert len(s) == pp and sum(s) == layers and min(s) >= 0
    # pp = 1 is all layers (the paper's closed form would cost L + 5).
    assert _split(44, 1) == [44]
    # Interleaved: Megatron's even split over pp × v chunks, two chunks per device.
    assert _split(44, 2, v=2) == [22, 22]
    assert _split(48, 4, v=2) == [12, 12, 12, 12]


def test_stage_layers_needs_the_layout_not_a_layer_count():
    with pytest.raises(TypeError, match="rule"):
        stage_layers(44, 4)


def test_parameter_counts_table_iii():
    job = make_job(tp=1, pp=1, dp=1)
    # GPT-NeoX layer: 12 h² + 13 h (Eq. 6 with biases and two LayerNorms).
    h = 6144
    assert layer_parameters(job.model) == 12 * h * h + 13 * h
    # One of tp = 4 ranks: column-parallel weights and biases (QKV 3h² + 3h, MLP-up 4h² + 4h) and
    # row-parallel weights (h², 4h²) split, row-parallel biases (2h) and norms (4h) whole.
    tp4 = make_job(tp=4, pipe_split="deepspeed_uniform")
    per_rank = layer_parameters(tp4.model, 4)
    assert per_rank == (12 * h * h + 7 * h) // 4 + 2 * h + 4 * h
    # The paper's split (DeepSpeed 'uniform', Eq. 3–5): 11 layers first, 9 last.
    params = stage_parameter_counts(tp4.model, tp4.layout)
    emb = 12672 * h
    assert params[0] == 11 * per_rank + emb
    assert params[-1] == 9 * per_rank + emb + 2 * h
    # NeoX's default split puts 10 on the last stage.
    neox = make_job(tp=4)
    assert stage_parameter_counts(neox.model, neox.layout)[-1] == 10 * per_rank + emb + 2 * h


def test_swiglu_gqa_params():
    llama = dict(GPT20B, hidden=4096, heads=32, kv_heads=8, ffn_hidden=11008, norm="rmsnorm",
                 activation="swiglu", parallel_residual=False)
    job = make_job(model=llama, tp=1, pp=1, dp=1)
    h, f = 4096, 11008
    expected = 2 * h + h * (h + 2 * h // 4) + h * h + 3 * h * f
    assert layer_parameters(job.model) == expected


# ----------------------------------------------------------------------------- closed forms
GPT3_175B = {"layers": 96, "hidden": 12288, "heads": 96, "seq_len": 2048, "vocab": 50257,
             "norm": "layernorm", "activation": "gelu", "pos_emb": "learned",
             "attention": "fused_softmax", "tied_embeddings": True}
LLAMA_7B = {"layers": 32, "hidden": 4096, "heads": 32, "seq_len": 2048, "vocab": 32000,
            "ffn_hidden": 11008, "norm": "rmsnorm", "activation": "swiglu", "pos_emb": "rotary",
            "attention": "flash", "tied_embeddings": False}


def _job(model, **layout):
    lay = {"pp": 1, "tp": 1, "dp": 1, "micro_batch": 1, "micro_batches": 1, "recompute": "none"}
    lay.update(layout)
    return TrainingJob.from_dict({"model": model, "layout": lay, "run": {"train_iters": 1}})


def test_gpt3_175b_closed_form():
    # Narayanan et al. (SC 2021): 12·L·h² + 13·L·h + V·h + s·h + 2·h, V the padded vocabulary.
    L, h, s, V = 96, 12288, 2048, padded_vocab(50257, 1)
    closed = 12 * L * h * h + 13 * L * h + V * h + s * h + 2 * h
    assert total_parameters(TrainingJob.from_dict({"model": GPT3_175B}).model) == closed
    assert 174.5e9 < closed < 175.5e9
    # perf-predict's JSON reports the same number.
    job = _job(GPT3_175B, pp=8, tp=8, dp=1, micro_batches=8)
    assert total_parameters(job.model) == closed


def test_llama_7b_closed_form():
    assert total_parameters(_job(LLAMA_7B).model) == 6_738_415_616


def test_gated_ffn_width_rules():
    assert gated_ffn_width(4096, "llama") == 11008          # LLaMA-7B
    assert gated_ffn_width(4096, "megatron") == 10880       # int(4·4096·2/3 / 64)·64
    with pytest.raises(ValueError, match="rule"):
        gated_ffn_width(4096, "nope")


def test_gpt3_flops_match_narayanan():
    # 72·B·s·L·h²·(1 + s/6h + V/12hL), no recompute, the whole attention square (fused softmax).
    L, h, s, V = 96, 12288, 2048, padded_vocab(50257, 1)
    B = 64
    closed = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    for lay in ({"micro_batch": 1, "micro_batches": 64},
                {"pp": 8, "tp": 8, "dp": 4, "micro_batch": 2, "micro_batches": 8}):
        job = _job(GPT3_175B, **lay)
        assert job.layout.global_batch == B
        got = model_flops_per_iteration(job.model, job.layout)
        assert abs(got / closed - 1) < 0.01


def _random_job(rng):
    """A random valid job: GPT-3- or LLaMA-style, MHA or GQA, any layout the rules accept."""
    heads = int(rng.choice([8, 16, 32]))
    head_dim = int(rng.choice([64, 128]))
    h = heads * head_dim
    gated = bool(rng.integers(2))
    kv = int(rng.choice([k for k in (1, 2, 4, 8, heads) if heads % k == 0]))
    tp = int(rng.choice([t for t in (1, 2, 4, 8) if kv % t == 0 and heads % t == 0]))
    layers = int(rng.integers(2, 40))
    pp = int(rng.choice([p for p in (1, 2, 4) if p <= layers]))
    model = {"layers": layers, "hidden": h, "heads": heads, "kv_heads": kv,
             "seq_len": int(rng.choice([512, 1024, 2048])), "vocab": int(rng.integers(1000, 60000)),
             "ffn_hidden": (gated_ffn_width(h, "llama") if gated else 4 * h),
             "norm": "rmsnorm" if gated else "layernorm", "activation": "swiglu" if gated else "gelu",
             "pos_emb": str(rng.choice(["rotary", "learned"])), "attention": "fused_softmax",
             "tied_embeddings": bool(rng.integers(2))}
    mbs = pp * int(rng.integers(1, 4))
    return _job(model, pp=pp, tp=tp, dp=int(rng.choice([1, 2])), micro_batch=int(rng.integers(1, 3)),
                micro_batches=mbs, pipe_split=str(rng.choice(["neox", "deepspeed_parameters"])))


def test_random_jobs_counts_split_and_flops_agree():
    import numpy as np
    from predictor import memory as mem
    rng = np.random.default_rng(7)
    for _ in range(60):
        job = _random_job(rng)
        m, lay = job.model, job.layout
        h, f, s, V = m.hidden, m.ffn_hidden, m.seq_len, padded_vocab(m.vocab, lay.tp)
        k = m.kv_heads * m.head_dim
        bias = m.norm == "layernorm"
        norm = (2 if bias else 1) * h
        up = (2 if m.activation == "swiglu" else 1) * f
        layer = h * (h + 2 * k) + h * h + h * up + f * h + 2 * norm \
            + (h + 2 * k + h + up + h if bias else 0)
        closed = m.layers * layer + V * h * (1 if m.tied_embeddings else 2) + norm \
            + (s * h if m.pos_emb == "learned" else 0)
        assert total_parameters(m, lay.tp) == closed
        # Summed over the pipeline and tp ranks, the stages hold the model (a tied embedding
        # twice when pp > 1; norms and row-parallel biases once per tp rank).
        per_stage = stage_parameter_counts(m, lay)
        replicated = m.layers * (2 * norm + (2 * h if bias else 0)) + norm \
            + (s * h if m.pos_emb == "learned" else 0)
        extra_head = V * h if (m.tied_embeddings and lay.pp > 1) else 0
        assert sum(per_stage) * lay.tp - replicated * (lay.tp - 1) == closed + extra_head
        # Timing and memory see the same split and parameters.
        sizes = stage_layers(m, lay)
        assert [e.parameters for e in mem.stage_estimates(m, lay)] == per_stage
        assert len(mem.stage_estimates(m, lay)) == len(sizes) == lay.pp
        # FLOPs: 6 per weight per token plus the attention square (Narayanan, generalised).
        tokens = lay.global_batch * s
        weights = m.layers * (h * (h + 2 * k) + h * h + h * up + f * h) + h * V
        flops = 6 * tokens * weights + 12 * tokens * s * m.layers * h
        assert abs(model_flops_per_iteration(m, lay) / flops - 1) < 0.01


def test_groups_sized_from_dp_not_gpus_per_node():
    # dp = 2, tp = 1 on 4-GPU nodes: a group of 2 GPUs inside a node (the paper's code used 4).
    g = groups(make_job(pp=2, tp=1, dp=2), 4)
    assert (g["dp"].nodes, g["dp"].gpus_per_node) == (1, 2)
    g = groups(make_job(pp=4, tp=4, dp=8), 4)
    assert (g["tp"].nodes, g["tp"].gpus_per_node) == (1, 4)
    assert (g["dp"].nodes, g["dp"].gpus_per_node) == (8, 1)
    g = groups(make_job(pp=4, tp=8, dp=4), 4)
    assert (g["tp"].nodes, g["tp"].gpus_per_node) == (2, 4)


def test_single_node_pipeline_is_intra_node():
    g = groups(make_job(pp=4, tp=1, dp=1), 4)
    assert g["pp"].nodes == 1
    g = groups(make_job(pp=4, tp=1, dp=2), 4)
    assert g["pp"].nodes == 2
    assert _group(8, 2, 8).gpus_per_node == 4


def test_torchtitan_op_level_checkpointing_recomputes_every_second_matmul():
    from predictor import load_platform, predict
    from predictor.recipe import op_sac_recompute_share, runs_op_sac
    llama = TrainingJob.from_dict({"model": {"layers": 2, "hidden": 4096, "heads": 32, "kv_heads": 8,
                                             "ffn_hidden": 14336, "seq_len": 4096, "attention": "flash",
                                             "activation": "swiglu", "norm": "rmsnorm"},
                                   "layout": {"recompute": "selective", "zero_stage": 0},
                                   "run": {"precision": "bf16", "framework": "torchtitan"}})
    m = llama.model
    # wq wk wv | wo | w1 w3 | w2: the 2nd (wk), 4th (wo) and 6th (w3) are run again.
    assert op_sac_recompute_share("linear1", m) == pytest.approx(8 / 48)
    assert (op_sac_recompute_share("linear2", m), op_sac_recompute_share("linear3", m),
            op_sac_recompute_share("linear4", m)) == (1.0, 0.5, 0.0)
    assert op_sac_recompute_share("flash_atten", m) == 0.0 and op_sac_recompute_share("rmsnorm", m) == 1.0
    gelu = llama.replace(model={"activation": "gelu", "ffn_hidden": 16384}).model
    assert (op_sac_recompute_share("linear3", gelu), op_sac_recompute_share("linear4", gelu)) == (0.0, 1.0)
    assert runs_op_sac(llama.layout, "torchtitan") and not runs_op_sac(llama.layout, "megatron")
    plat = load_platform("dgx-h100")
    secs = {rc: predict(llama.replace(layout={"recompute": rc}), plat).iteration_seconds
            for rc in ("none", "selective", "full")}
    assert secs["none"] < secs["selective"] < secs["full"]
