"""DeepSpeed's zero_optimization as the launches write it: what the prediction does not model is
said (ZeRO-2's overlap_comm)."""
from __future__ import annotations

import json

import pytest

from .helpers import parse_in
from .test_ds_checkpointing import DS_JSON, NEOX_SH, NEOX_YML, _mds, _neox


@pytest.mark.parametrize("zero, overlap, warned", [(2, True, True), (2, False, False), (1, True, False),
                                                   ("2", "true", True)])
def test_zero2s_overlap_comm_is_said_to_be_costed_without_it(tmp_path, zero, overlap, warned):
    """ZeRO-2's per-micro-batch reductions are costed after each backward; a config that hides them
    under it (overlap_comm) is told so, in a DeepSpeed JSON and in a NeoX YAML alike."""
    mds = _mds(tmp_path, "", {**DS_JSON, "zero_optimization": {"stage": zero, "overlap_comm": overlap}})
    said = [w for w in mds.warnings if "overlap_comm at ZeRO stage 2 is not modelled" in w]
    assert len(said) == warned, mds.warnings
    if warned:
        assert "an upper bound; " in said[0] and "ds.json" in said[0]
    neox = _neox(tmp_path, "")
    assert not [w for w in neox.warnings if "overlap_comm" in w]
    yml = NEOX_YML.replace('"pipe-parallel-size": 2', '"pipe-parallel-size": 1').replace(
        '"zero_optimization": {"stage": 1},',
        f'"zero_optimization": {{"stage": {json.dumps(zero)}, "overlap_comm": {json.dumps(overlap)}}},')
    res = parse_in(tmp_path, NEOX_SH, {"20B.yml": yml % ""})
    assert res.error is None, res.error
    assert len([w for w in res.warnings if "overlap_comm at ZeRO stage 2 is not modelled" in w]) == warned
