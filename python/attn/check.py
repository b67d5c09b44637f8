"""Exactness checks for learners: the tiled and split-K kernels against the textbook method on random
f64 data (attn check's widget, from Python). Exact means within 1e-12."""
import numpy as np

from . import _C

TOLERANCE = 1e-12


def _run(q, k, v, **kw):
    b, s, h, _ = q.shape
    out = np.empty_like(q)
    lse = np.empty((b, h, s))
    _C.forward(q, k, v, out, lse, **kw)
    return out, lse


def _problem(seq_q, seq_k, head_dim, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((1, seq_q, 1, head_dim)), rng.standard_normal((1, seq_k, 1, head_dim)),
            rng.standard_normal((1, seq_k, 1, head_dim)))


def tiled(seq=1000, head_dim=16, tile=64, seed=1):
    """seq queries x seq keys in tiles of `tile` queries and keys, against the reference: the largest
    difference of the outputs (exact: <= 1e-12)."""
    q, k, v = _problem(seq, seq, head_dim, seed)
    got, _ = _run(q, k, v, algorithm="tiled", q_tile=tile, k_tile=tile)
    want, _ = _run(q, k, v, algorithm="reference")
    return float(np.abs(got - want).max())


def splitk(keys=100000, workers=8, head_dim=16, seed=1):
    """One query over `keys` keys split across `workers` slices whose states are merged, against the
    reference: the largest difference of the outputs."""
    q, k, v = _problem(1, keys, head_dim, seed)
    got, _ = _run(q, k, v, algorithm="splitk", num_splits=workers)
    want, _ = _run(q, k, v, algorithm="reference")
    return float(np.abs(got - want).max())
