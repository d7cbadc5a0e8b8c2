"""Every corpus script parses to its expected job, request, provenance and warnings."""
import json

import pytest

from .corpus_runner import cases, compare, run_case


@pytest.mark.parametrize("case", cases(), ids=lambda p: p.name)
def test_corpus_case(case):
    res, exp = run_case(case)
    diffs = compare(res, exp)
    assert not diffs, "\n".join(diffs)
    json.dumps(res.to_dict())   # the answer is JSON-able


def test_corpus_is_large_enough():
    assert len(cases()) >= 25
