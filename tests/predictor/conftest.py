import pytest

from predictor import TrainingJob, load_platform

GPT20B = {"layers": 44, "hidden": 6144, "heads": 64, "seq_len": 2048, "parallel_residual": True,
          "attention": "fused_softmax", "norm": "layernorm", "activation": "gelu"}


def make_job(model=None, **layout):
    lay = {"pp": 4, "tp": 4, "dp": 8, "micro_batch": 4, "micro_batches": 16, "zero_stage": 1,
           "recompute": "full"}
    lay.update(layout)
    return TrainingJob.from_dict({"model": dict(model or GPT20B), "layout": lay,
                                  "run": {"train_iters": 100}})


@pytest.fixture(scope="session")
def perlmutter():
    return load_platform("perlmutter-a100")


@pytest.fixture(scope="session")
def vista():
    return load_platform("vista-gh200")
