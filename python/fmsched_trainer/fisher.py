"""Task2Vec probe: the diagonal of the Fisher information matrix of the
trainable parameters (thesis Eq. 3.2), estimated as the mean squared
gradient over batches. Computed twice on two random subsets (F and F'), as
the asymmetric distance of thesis Eq. 3.4 needs.

Works on any iterable of per-batch gradient vectors (lists of floats, NumPy
arrays or flattened PyTorch tensors), so it needs no framework itself.
"""

from __future__ import annotations

import math
import random
from typing import Callable, Iterable, List, Sequence


def diagonal_fisher(gradients: Iterable[Sequence[float]]) -> List[float]:
    """Mean of the element-wise squared gradients."""
    total: List[float] = []
    n = 0
    for g in gradients:
        values = [float(x) for x in (g.tolist() if hasattr(g, "tolist") else g)]
        if not total:
            total = [0.0] * len(values)
        if len(values) != len(total):
            raise ValueError(f"gradient {n} has {len(values)} entries, the first had {len(total)}")
        for i, x in enumerate(values):
            if not math.isfinite(x):
                raise ValueError(f"gradient {n}[{i}] is not finite")
            total[i] += x * x
        n += 1
    if n == 0:
        raise ValueError("no gradients: the probe needs at least one batch")
    return [t / n for t in total]


def task2vec_embedding(
    batches: Sequence[object],
    gradient_of: Callable[[object], Sequence[float]],
    probe_batches: int = 8,
    seed: int = 0,
) -> tuple:
    """(F, F'): the diagonal Fisher on two disjoint random subsets of
    ``batches``, each of at most ``probe_batches`` batches. ``gradient_of``
    returns the flattened gradient of the trainable (e.g. PETL) parameters
    for one batch."""
    if len(batches) < 2:
        raise ValueError("need at least two batches for F and F'")
    order = list(range(len(batches)))
    random.Random(seed).shuffle(order)
    half = len(order) // 2
    a = order[:half][:probe_batches]
    b = order[half:][:probe_batches]
    return (
        diagonal_fisher(gradient_of(batches[i]) for i in a),
        diagonal_fisher(gradient_of(batches[i]) for i in b),
    )
