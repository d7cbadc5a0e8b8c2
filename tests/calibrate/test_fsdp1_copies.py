"""calibrate/fsdp1_copies.py: FSDP1's copies counted operator by operator on the CPU are the bytes
predictor.recipe.fsdp1_shard_copies gives (llm-foundry / Composer)."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("mixed, strategy, ranks", [("DEFAULT", "FULL_SHARD", 8), ("PURE", "SHARD_GRAD_OP", 2),
                                                    ("DEFAULT", "FULL_SHARD", 1)])
def test_the_count_matches_pytorchs_fsdp1_operator_by_operator(mixed, strategy, ranks):
    # The same bytes, in any torch that still has FSDP1.
    pytest.importorskip("torch", reason="counting FSDP1's operators needs torch (the calibrate extra)")
    import torch.distributed as dist

    from calibrate.fsdp1_copies import count, modelled
    if dist.is_initialized():
        pytest.skip("a process group is already up in this session")
    measured, model = count(mixed, strategy, ranks), modelled(mixed, strategy, ranks)
    assert not dist.is_initialized()
    assert measured.forward_bytes == pytest.approx(model["forward_bytes"], rel=1e-12)
    assert measured.backward_bytes == pytest.approx(model["backward_bytes"], rel=1e-12)
    # (the flat gradient is built from the views' gradients in every configuration)
    assert measured.backward_bytes > 0 and "cat" in measured.backward_ops


def test_an_unknown_mixed_precision_word_is_named():
    pytest.importorskip("torch", reason="counting FSDP1's operators needs torch (the calibrate extra)")
    from calibrate.fsdp1_copies import count
    with pytest.raises(ValueError, match="unknown mixed_precision 'HALF'"):
        count("HALF", "FULL_SHARD", 2)
