"""Whether a set of runs identifies each fitted factor: the standard error of its log in a linearised
least-squares fit with every other candidate factor free.  Used by the platform-wide fit
(:mod:`calibrate.validate`) and the per-kind one (:mod:`calibrate.fitting.kinds`) alike."""
from __future__ import annotations

from typing import Sequence

import numpy as np

# The scatter of a run's log ratio that the factors cannot explain is taken as what a linearised
# least-squares fit leaves (identified), never below the spread of repeated steps of one run: 0.03,
# the mean standard deviation of log step time over the shipped H100 runs' five steps
# (benchmarks/data/h100-lent/train-family.json: mean 0.028, median 0.022).
NOISE_FLOOR = 0.03
# Fewer runs than this cannot say whether a fitted scale carries to other jobs (leave-one-out
# leaves too little to fit on): the platform-wide fit and the per-kind one alike.
MIN_FIT_RUNS = 3


def identified(J: np.ndarray, sees: np.ndarray, resid: np.ndarray, among: Sequence[int],
               names: Sequence[str]) -> dict[str, float]:
    """How well the runs pin each factor down: the standard deviation of its log fitted by least
    squares with every other candidate factor free (inf where collinear), for the candidates
    ``among`` (factor indices) that any of the runs sees.

    ``names``: the factor of each of J's columns.  ``resid``: the runs' log errors (predicted /
    measured); the scatter is what a least-squares fit of them on the candidates' elasticities
    leaves, per degree of freedom (never below :data:`NOISE_FLOOR`); the standard deviation of
    factor j is that over the norm of the part of its elasticity column no combination of the
    other candidates' columns explains.
    """
    cand = [j for j in among if sees[:, j].any()]
    out: dict[str, float] = {}
    if not cand:
        return out
    rows = sees[:, cand].any(axis=1)
    A = J[rows][:, cand]
    # The scatter the candidates cannot explain: the residual of the least-squares fit of the log
    # errors on the elasticities (the linearised fit), per degree of freedom left.
    coef, *_ = np.linalg.lstsq(A, resid[rows], rcond=None)
    dof = max(int(rows.sum()) - len(cand), 1)
    sigma = max(float(np.sqrt(np.sum((resid[rows] - A @ coef) ** 2) / dof)), NOISE_FLOOR)
    for c, j in enumerate(cand):
        col = A[:, c]
        others = np.delete(A, c, axis=1)
        if others.shape[1]:
            coef, *_ = np.linalg.lstsq(others, col, rcond=None)
            col = col - others @ coef
        norm = float(np.linalg.norm(col))
        # Collinear to float precision (the elasticity of a factor is a cost share, exact to ~1e-6).
        out[names[j]] = sigma / norm if norm > 1e-4 * max(float(np.linalg.norm(A[:, c])), 1e-12) else np.inf
    return out
