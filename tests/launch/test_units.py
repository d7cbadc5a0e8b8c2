"""Unit tests of the pieces: #SBATCH reading, Slurm time formats, GPU spellings, rampup, NeoX FFN rule."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_plugin.launch import SlurmRequest, parse_script
from slurm_plugin.launch.derive import rampup_iterations, rampup_iterations_slow
from slurm_plugin.launch.sbatch import gres_gpus, parse_time_minutes, read_directives


@pytest.mark.parametrize("text, minutes", [
    ("30", 30), ("0:30:00", 30), ("6:00:00", 360), ("100:00:00", 6000), ("3-00:00:00", 4320),
    ("01-00:00:00", 1440), ("1-12", 2160), ("1-0:30", 1470), ("10:30", 11), ("UNLIMITED", None), ("bogus", None),
])
def test_time_formats(text, minutes):
    assert parse_time_minutes(text) == minutes


@pytest.mark.parametrize("text, n", [("gpu:8", 8), ("gpu:a100:4", 4), ("gpu", 1), ("nic:1,gpu:v100:2", 2),
                                     ("craynetwork:1", None), ("gpu:4(S:0-1)", 4)])
def test_gres(text, n):
    assert gres_gpus(text) == n


def test_directives_stop_at_first_command_and_skip_comments():
    d = read_directives("#!/bin/bash\n#SBATCH -N 3\n\n# #SBATCH -N 5\n##SBATCH -N 6\n #SBATCH -N 7\n"
                        "#SBATCH --partition=a # --partition=b\nexport X=1\n#SBATCH -N 9\n", "s")
    assert d.request.nodes == 3
    assert d.request.partition == "a"
    assert d.provenance["request.nodes"] == "s:2"


def test_caller_request_wins_and_is_recorded():
    res = parse_script("s", "#!/bin/bash\n#SBATCH --nodes=2 --gres=gpu:4 -t 10\nsrun python pretrain_gpt.py "
                       "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 64 "
                       "--micro-batch-size 1 --train-iters 1\n",
                       request=SlurmRequest(nodes=3, gpus_per_node=8))
    assert (res.request.nodes, res.request.gpus_per_node, res.request.time_limit_minutes) == (3, 8, 10)
    assert res.provenance["request.nodes"] == "request"
    assert res.job is not None and res.job.layout.dp == 3   # one srun task per node


@settings(max_examples=300, deadline=None, database=None)
@given(st.integers(1, 64), st.integers(1, 16), st.integers(1, 30), st.integers(1, 20_000), st.integers(0, 200_000))
def test_rampup_matches_megatron_loop(start, incr, steps, ramp, samples):
    gbs = start + incr * steps
    assert rampup_iterations(samples, gbs, start, incr, ramp) == rampup_iterations_slow(samples, gbs, start, incr, ramp)


def test_rampup_bloom_logged_iterations():
    # BLOOM-176B README log: 220M samples, GBS 2048, rampup 192 16 9_765_625 -> 115,311 iterations
    assert rampup_iterations(220_000_000, 2048, 192, 16, 9_765_625) == 115_311


def test_rampup_huge_counts_are_cheap():
    assert rampup_iterations(10**15, 4096, 32, 32, 10**14) > 0


def _neox(tmp_path, yml: str):
    (tmp_path / "m.yml").write_text(yml)
    (tmp_path / "j.sbatch").write_text("#!/bin/bash\n#SBATCH -N 1 --gpus-per-node=8\n"
                                       "python deepy.py train.py m.yml\n")
    return parse_script(str(tmp_path / "j.sbatch"))


@pytest.mark.parametrize("extra, ffn", [
    ('"activation": "swiglu", "intermediate_size": 32768, "mlp_multiple_of": 256', 11008),   # llama-7B
    ('"activation": "swiglu", "intermediate_size": 14336', 4778),                            # mistral note
    ('"activation": "gelu"', 16384),
    ('"mlp_type": "llama", "activation": "silu"', 11008),
    # configs/mistral/7B.yml: LLaMAParallelMLP takes intermediate_size as its width (it was 11008)
    ('"mlp_type": "llama", "activation": "silu", "intermediate_size": 14336', 14336),
])
def test_neox_ffn_rule(tmp_path, extra, ffn):
    res = _neox(tmp_path, '{"num_layers": 2, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 64,'
                          ' "train_micro_batch_size_per_gpu": 1, "train_iters": 1, ' + extra + "}")
    assert res.error is None, res.error
    assert res.job.model.ffn_hidden == ffn
    assert res.job.model.activation == ("gelu" if '"gelu"' in extra else "swiglu")
    # silu under the LLaMA MLP is SwiGLU: no "modelled as gelu" beside it
    assert not any("modelled as gelu" in w for w in res.warnings), res.warnings


def test_llama2_70b_ffn(tmp_path):
    res = _neox(tmp_path, '{"num_layers": 2, "hidden_size": 8192, "num_attention_heads": 64, "num_kv_heads": 8,'
                          ' "seq_length": 64, "intermediate_size": 86016, "mlp_multiple_of": 256,'
                          ' "activation": "swiglu", "attention_config": [[["flash"], "all"]],'
                          ' "train_micro_batch_size_per_gpu": 1, "train_iters": 1}')
    assert res.job.model.ffn_hidden == 28672
    assert res.job.model.kv_heads == 8 and res.job.model.attention == "flash"


def test_to_dict_is_json_and_has_every_part(tmp_path):
    import json
    res = _neox(tmp_path, '{"num_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "seq_length": 64,'
                          ' "train_micro_batch_size_per_gpu": 1, "train_iters": 3}')
    d = json.loads(json.dumps(res.to_dict()))
    assert set(d) >= {"job", "job_dict", "request", "provenance", "warnings", "unresolved", "framework", "error"}
    assert d["job"]["run"]["train_iters"] == 3 and d["request"]["nodes"] == 1


def test_megatron_recompute_flags():
    base = ("#!/bin/bash\n#SBATCH -N 1 --gpus-per-node=1\npython pretrain_gpt.py --num-layers 2 --hidden-size 64 "
            "--num-attention-heads 2 --seq-length 64 --micro-batch-size 1 --train-iters 1 ")
    assert parse_script("s", base + "--recompute-activations\n").job.layout.recompute == "selective"
    assert parse_script("s", base + "--recompute-granularity full\n").job.layout.recompute == "full"
    assert parse_script("s", base + "--deepspeed --checkpoint-activations\n").job.layout.recompute == "full"
    assert parse_script("s", base + "\n").job.layout.recompute == "none"
    assert parse_script("s", base + "--use-distributed-optimizer\n").job.layout.zero_stage == 1


# ------------------------------------------------------------------------- pipeline split
_NEOX_PP = ('{"num_layers": 8, "hidden_size": 64, "num_attention_heads": 2, "seq_length": 64, '
            '"pipe_parallel_size": 2, "train_micro_batch_size_per_gpu": 1, "train_iters": 1%s}')


@pytest.mark.parametrize("extra, rule, warning", [
    ("", "neox", None),
    (', "pipe_partition_method": "parameters"', "deepspeed_parameters", None),
    (', "pipe_partition_method": "uniform"', "deepspeed_uniform", None),
    (', "pipe-partition-method": "type:transformer"', "neox", None),
    (', "pipe_partition_method": "type:mlp|transformer"', "neox", None),
    (', "pipe_partition_method": "type:ParallelTransformerLayerPipe"', "neox", "not modelled"),
    (', "pipe_partition_method": "type:(a+)+$"', "neox", "does not evaluate"),
    # a regex matching no layer, or another method, stops the job: tests/launch/test_value_typos_configs.py
])
def test_neox_pipe_partition_method(tmp_path, extra, rule, warning):
    res = _neox(tmp_path, _NEOX_PP % extra)
    assert res.error is None, res.error
    assert res.job.layout.pipe_split == rule
    origin = res.provenance["layout.pipe_split"]
    assert origin.startswith("NeoX default") if not extra else "m.yml" in origin
    if warning:
        assert any("pipe_partition_method" in w and warning in w for w in res.warnings), res.warnings
    else:
        assert not any("pipe_partition_method" in w for w in res.warnings)


def _megatron(args: str, layers: int = 44, ds: str = ""):
    return parse_script("s", "#!/bin/bash\n#SBATCH -N 1 --gpus-per-node=4\ntorchrun --nproc_per_node 4 "
                        f"pretrain_gpt.py --num-layers {layers} --hidden-size 64 --num-attention-heads 2 "
                        f"--seq-length 64 --micro-batch-size 1 --train-iters 1 {ds}{args}\n")


def test_megatron_pipeline_split_arguments():
    from predictor.recipe import stage_layers
    res = _megatron("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 8 "
                    "--decoder-last-pipeline-num-layers=10")
    assert res.error is None, res.error
    lay = res.job.layout
    assert (lay.pipe_split, lay.first_stage_layers, lay.last_stage_layers) == ("megatron", 8, 10)
    assert stage_layers(res.job) == [8, 13, 13, 10]
    assert res.provenance["layout.first_stage_layers"] == "s:3"
    assert res.provenance["layout.pipe_split"].startswith("Megatron-LM rule")
    res = _megatron("--pipeline-model-parallel-size 4 --account-for-embedding-in-pipeline-split "
                    "--account-for-loss-in-pipeline-split", layers=46)
    assert res.error is None, res.error
    assert res.job.layout.account_for_embedding and res.job.layout.account_for_loss
    assert stage_layers(res.job) == [11, 12, 12, 11]
    assert res.provenance["layout.account_for_loss"] == "s:3"


def test_megatron_refuses_a_pp_that_does_not_divide_the_layers():
    res = _megatron("--pipeline-model-parallel-size 4", layers=42)
    assert res.error is not None and res.job is None
    assert "layout.pp" in res.error and "divisible" in res.error
    # The same layers and pp under GPT-NeoX's rule are fine (DeepSpeed balances).
    assert _megatron("--pipeline-model-parallel-size 2", layers=42).error is None


def test_megatron_split_options_outside_megatron_lm():
    res = _megatron("--decoder-first-pipeline-num-layers 8")                 # pp = 1
    assert res.error is None and res.job.layout.first_stage_layers == 0
    assert any("no effect with one pipeline stage" in w for w in res.warnings)
    res = _megatron("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 8",
                    ds="--deepspeed ")
    assert res.error is None and res.framework == "megatron-deepspeed"
    assert res.job.layout.pipe_split == "neox" and res.job.layout.first_stage_layers == 0
    assert any("Megatron-DeepSpeed ignores it" in w for w in res.warnings)
