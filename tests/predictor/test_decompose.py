from predictor.decompose import (_group, groups, layer_params, padded_vocab, stage_layers,
                                 stage_params, vocab_per_rank)

from .conftest import GPT20B, make_job


def test_vocab_padding_eq1_eq2():
    assert padded_vocab(50257, 1) == 50304
    assert padded_vocab(50257, 4) == 50688 and vocab_per_rank(50257, 4) == 12672
    assert vocab_per_rank(50257, 8) == 6400


def test_stage_split_matches_paper_eq3_5():
    # (L + 5) / pp split uniformly, embedding + hook on the first stage, three items on the last.
    assert stage_layers(44, 4) == [11, 12, 12, 9]
    assert stage_layers(32, 4) == [8, 9, 9, 6]
    assert stage_layers(40, 4) == [10, 11, 11, 8]


def test_stage_split_sums_and_small_pp():
    for layers in (1, 2, 7, 24, 44, 45, 80, 96):
        for pp in (1, 2, 3, 4, 8):
            if layers >= pp:
                s = stage_layers(layers, pp)
                assert sum(s) == layers and min(s) >= 0
    # pp = 1 is all layers (the paper's closed form would cost L + 5).
    assert stage_layers(44, 1) == [44]
    assert stage_layers(44, 4, virtual_stages=2) == [11, 11, 11, 11]


def test_parameter_counts_table_iii():
    job = make_job(tp=1, pp=1, dp=1)
    # GPT-NeoX layer: 12 h² + 13 h (Eq. 6 with biases and two LayerNorms).
    h = 6144
    assert layer_params(job) == 12 * h * h + 13 * h
    tp4 = make_job(tp=4)
    assert abs(layer_params(tp4) - (12 * h * h + 9 * h) / 4 - 4 * h) < 1e-6
    params = stage_params(tp4)
    emb = 12672 * h
    assert params[0] == 11 * layer_params(tp4) + emb
    assert params[-1] == 9 * layer_params(tp4) + emb + 2 * h


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
