"""calibrate/op_sac.py: TorchTitan's op-level SAC policy saves every other matmul of each checkpointed
call, and what it keeps of a Llama-shaped layer is what predictor.memory counts."""
from __future__ import annotations

import pytest

TOKENS, WIDTHS = 5, (8, 16, 24, 32, 40)


def _torch():
    return pytest.importorskip("torch", reason="running selective checkpointing needs torch (the calibrate extra)")


def _four_matmuls():
    """A module of four bias-free linears, each wider than the one before, so that a forward
    matmul (``(tokens, w_in) @ (w_in, w_out)``, w_out > w_in) is told from the backward's by its
    operands' shapes, and its place by its input width."""
    torch = _torch()
    from torch import nn

    class FourMatmuls(nn.Module):
        def __init__(self):
            super().__init__()
            self.linears = nn.ModuleList(nn.Linear(a, b, bias=False) for a, b in zip(WIDTHS, WIDTHS[1:]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for linear in self.linears:
                x = torch.relu(linear(x))
            return x
    return FourMatmuls()


def _recomputed_matmuls(run_backward) -> list[int]:
    """Which forward matmuls (1-based, forward order) the backward runs again: the checkpoint's
    cache answers the saved ones without calling the operator."""
    torch = _torch()
    from torch.utils._python_dispatch import TorchDispatchMode

    class ForwardMatmuls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen: list[int] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            if func == torch.ops.aten.mm.default and args[0].shape[0] == TOKENS \
                    and args[1].shape[1] > args[1].shape[0]:
                self.seen.append(WIDTHS.index(args[0].shape[1]) + 1)
            return func(*args, **(kwargs or {}))

    mode = ForwardMatmuls()
    with mode:
        run_backward()
    return mode.seen


def _checkpointed(module, x):  # noqa: ANN001, ANN202
    """``module(x)`` under op-level SAC, with the whole forward rerun in the backward (no early
    stop), so that what is not run again was saved."""
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    from calibrate.op_sac import op_sac_context
    with set_checkpoint_early_stop(False):
        return checkpoint(module, x, use_reentrant=False, context_fn=op_sac_context)


def test_the_policy_saves_the_first_and_third_of_four_matmuls_in_every_call():
    torch = _torch()
    module = _four_matmuls()
    x = torch.randn(TOKENS, WIDTHS[0], requires_grad=True)
    # Twice: the count starts afresh for each checkpointed call.
    for _ in range(2):
        out = _checkpointed(module, x)
        assert _recomputed_matmuls(lambda: out.sum().backward()) == [2, 4]


def test_each_checkpointed_layer_counts_its_own_matmuls():
    torch = _torch()
    from torch import nn
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    from torch.utils.checkpoint import set_checkpoint_early_stop

    from calibrate.op_sac import op_sac_context

    class Narrow(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[:, :WIDTHS[0]]

    def wrapped(module: nn.Module) -> nn.Module:
        return checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT, context_fn=op_sac_context,
                                  preserve_rng_state=False)
    layers = nn.Sequential(wrapped(_four_matmuls()), Narrow(), wrapped(_four_matmuls()))
    x = torch.randn(TOKENS, WIDTHS[0], requires_grad=True)
    with set_checkpoint_early_stop(False):
        out = layers(x)
    # Counted across the two layers, the second layer would recompute its first and third.
    assert sorted(_recomputed_matmuls(lambda: out.sum().backward())) == [2, 2, 4, 4]


def test_the_policy_saves_the_listed_operators_and_recomputes_the_rest():
    torch = _torch()
    from collections import defaultdict
    from types import SimpleNamespace

    from torch.utils.checkpoint import CheckpointPolicy

    from calibrate.op_sac import op_sac_policy
    counts: defaultdict = defaultdict(int)
    policy = op_sac_policy(counts)
    forward, recompute = SimpleNamespace(is_recompute=False), SimpleNamespace(is_recompute=True)
    aten = torch.ops.aten
    got = [policy(forward, op) for op in (aten.mm.default, aten.relu.default, aten.addmm.default,
                                         aten._scaled_dot_product_flash_attention_for_cpu.default, aten.mm.default)]
    assert got == [CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE,
                   CheckpointPolicy.MUST_SAVE, CheckpointPolicy.MUST_SAVE]
    # The recomputation keeps its own count.
    assert policy(recompute, aten.mm.default) == CheckpointPolicy.MUST_SAVE
    assert dict(counts) == {"forward": 3, "recompute": 1}


@pytest.mark.parametrize("index", range(3))
def test_what_the_checkpoint_keeps_is_what_the_memory_model_counts(index):
    _torch()
    from calibrate.op_sac import SHAPES, kept_bytes, modelled_bytes
    shape = SHAPES[index]
    got, model = kept_bytes(shape), modelled_bytes(shape)
    assert got.kept_bytes == pytest.approx(model["op_sac"], rel=1e-12), shape
    assert model["full"] < got.kept_bytes < model["none"]
    assert set(got.by_operator) == {"mm", "_scaled_dot_product_flash_attention_for_cpu"}
