import pytest

from predictor.decompose import (_group, groups, layer_params, padded_vocab, stage_layers,
                                 stage_params, vocab_per_rank)

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
    assert layer_params(job) == 12 * h * h + 13 * h
    # The paper's split (DeepSpeed 'uniform', Eq. 3–5): 11 layers first, 9 last.
    tp4 = make_job(tp=4, pipe_split="deepspeed_uniform")
    assert abs(layer_params(tp4) - (12 * h * h + 9 * h) / 4 - 4 * h) < 1e-6
    params = stage_params(tp4)
    emb = 12672 * h
    assert params[0] == 11 * layer_params(tp4) + emb
    assert params[-1] == 9 * layer_params(tp4) + emb + 2 * h
    # NeoX's default split puts 10 on the last stage.
    assert stage_params(make_job(tp=4))[-1] == 10 * layer_params(tp4) + emb + 2 * h


def test_swiglu_gqa_params():
    llama = dict(GPT20B, hidden=4096, heads=32, kv_heads=8, ffn_hidden=11008, norm="rmsnorm",
                 activation="swiglu", parallel_residual=False)
    job = make_job(model=llama, tp=1, pp=1, dp=1)
    h, f = 4096, 11008
    expected = 2 * h + h * (h + 2 * h // 4) + h * h + 3 * h * f
    assert layer_params(job) == expected


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
