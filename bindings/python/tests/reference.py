"""A float64 numpy reference of decoder attention over positions (docs/semantics.md sections 5 and 7)."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np


def decoder_attention(q: np.ndarray, keys: Sequence[np.ndarray], values: Sequence[np.ndarray],
                      query_lens: Sequence[int], context_lens: Sequence[int], *,
                      scale: Optional[float] = None, soft_cap: float = 0.0, window: int = 0,
                      alibi: Optional[np.ndarray] = None, sinks: Optional[np.ndarray] = None,
                      chunk: int = 0, tree_masks: Optional[Sequence[Optional[np.ndarray]]] = None
                      ) -> Tuple[np.ndarray, np.ndarray]:
    """q: [T, H, D]; keys[i]/values[i]: every token of sequence i, [context+query, Hkv, D].
    sinks: a logit per head joining every row's softmax without a value; chunk: C > 0 keeps
    the keys k with k // C == p // C; tree_masks[i]: None (causal) or sequence i's boolean
    [query, query] matrix, m[r, j] = new token r sees new token j (the context stays visible).
    Returns (out [T, H, D], lse [T, H]) in float64."""
    T, H, D = q.shape
    out = np.zeros((T, H, D))
    lse = np.full((T, H), -np.inf)
    scale = 1.0 / np.sqrt(D) if not scale else scale
    row = 0
    for i, (ql, cl) in enumerate(zip(query_lens, context_lens)):
        K = np.asarray(keys[i], dtype=np.float64)
        V = np.asarray(values[i], dtype=np.float64)
        g = H // K.shape[1]
        tree = None if tree_masks is None else tree_masks[i]
        for j in range(ql):
            p = cl + j
            pos = np.arange(p + 1)
            if tree is not None:
                pos = pos[(pos < cl) | np.asarray(tree, dtype=bool)[j][np.maximum(pos - cl, 0)]]
            if window > 0:
                pos = pos[p - pos < window]
            if chunk > 0:
                pos = pos[pos // chunk == p // chunk]
            for h in range(H):
                kh = h // g
                s = K[pos, kh, :] @ q[row, h].astype(np.float64) * scale
                if soft_cap > 0:
                    s = soft_cap * np.tanh(s / soft_cap)
                if alibi is not None:
                    s = s + float(alibi[h]) * (pos - p)
                sink = -np.inf if sinks is None else float(sinks[h])
                m = max(s.max(), sink)
                e = np.exp(s - m)
                total = e.sum() + np.exp(sink - m)
                out[row, h] = e @ V[pos, kh, :] / total
                lse[row, h] = m + np.log(total)
            row += 1
    return out, lse


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float64)
    if np.isnan(got).any():
        return float("inf")
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
