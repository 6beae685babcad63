"""The estimators both backends score held-out sets with.

``pass@k`` is the unbiased estimator of Chen et al. (2021) from n samples per problem with c correct:
1 - C(n-c, k) / C(n, k). The local evaluation (mmrl/trainer/evaluate.py) and the OpenRLHF backend's
(mmrl/openrlhf/evaluation.py) both call it, so a set's pass@k means the same whatever ran it.
"""

from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
