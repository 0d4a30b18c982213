"""The log-sum-exp conventions of the spec (ATTN-LSE-1..4), in float64.

- `lse` is the natural logarithm of the row's softmax denominator, `log(sum_j exp(S[i,j]))` over the
  visible keys, plus `exp(sink)` when the head has a sink (ATTN-SINK-2). A row with no visible key and no
  sink has an empty sum: lse = -inf (ATTN-LSE-2); with a sink, lse = sink.
- `from_base2` / `to_base2` convert the base-2 statistic some kernels return (FlashInfer's
  `return_lse`: `m + log2(d)` in `include/flashinfer/attention/state.cuh`) to and from the natural log.
  -inf maps to -inf.
- `merge_partials` combines attention computed over disjoint chunks of the keys (split-KV,
  context parallelism, flash-attention's `combine` kernel) into attention over their union
  (ATTN-LSE-4). A chunk in which a row sees no key has out 0 and lse -inf and gets weight 0; a row that
  sees no key in any chunk stays out 0, lse -inf. A sink is a chunk of its own: out 0, lse = sink.
  A chunk with lse +inf holds all the mass (ATTN-LSE-7): the merge's lse is +inf and its output that
  chunk's (the mean of such chunks'); +inf is never read as an empty chunk. `merge_states` is the
  two-part form (vLLM's `merge_attn_states`), `empty_as_spec` maps a convention's empty-row sentinel.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

LN2 = float(np.log(2.0))


def from_base2(lse2) -> np.ndarray:
    """A base-2 log-sum-exp `log2(sum exp(S))` as the natural-log lse: `lse2 * ln 2` (-inf stays -inf)."""
    return np.asarray(lse2, dtype=np.float64) * LN2


def to_base2(lse) -> np.ndarray:
    """The natural-log lse as a base-2 statistic: `lse / ln 2` (-inf stays -inf)."""
    return np.asarray(lse, dtype=np.float64) / LN2


def merge_partials(outs: Sequence[np.ndarray], lses: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(out, lse) over the union of disjoint key chunks, from each chunk's (out (..., Dv), lse (...)).

        lse = log sum_c exp(lse_c),    out = sum_c exp(lse_c - lse) out_c

    computed with the largest lse_c subtracted first, so it never overflows. Rows where every lse_c is
    -inf (no chunk has a visible key) give out 0 and lse -inf; a chunk whose lse is -inf contributes
    nothing, whatever its out holds (a kernel's empty-row output is 0, but 0 * NaN must not leak).
    """
    if len(outs) != len(lses) or not outs:
        raise ValueError(f"merge_partials needs as many outputs as lses, at least one; got {len(outs)} and {len(lses)}")
    o = np.stack([np.asarray(x, dtype=np.float64) for x in outs])        # (C, ..., Dv)
    l = np.stack([np.asarray(x, dtype=np.float64) for x in lses])        # (C, ...)
    if o.shape[:-1] != l.shape:
        raise ValueError(f"outputs {o.shape[1:]} and lses {l.shape[1:]} do not match (out has one more axis)")
    with np.errstate(invalid="ignore", over="ignore"):
        m = l.max(axis=0)
        m_safe = np.where(np.isneginf(m), 0.0, m)
        w = np.exp(l - m_safe)                                            # exp(-inf) = 0 for empty chunks
        total = w.sum(axis=0)
        live = total > 0
        lse = np.where(live, m_safe + np.log(np.where(live, total, 1.0)), -np.inf)
        frac = np.where(live, w / np.where(live, total, 1.0), 0.0)
        # an lse of +inf holds all the mass (ATTN-LSE-7): the +inf parts share the weight, never read as empty
        infinite = np.isposinf(l)
        n_inf = infinite.sum(axis=0)
        frac = np.where(n_inf > 0, infinite / np.maximum(n_inf, 1), frac)
        lse = np.where(n_inf > 0, np.inf, lse)
        out = (frac[..., None] * np.where(frac[..., None] > 0, o, 0.0)).sum(axis=0)
    return out, lse


def merge_states(out_a, lse_a, out_b, lse_b) -> tuple[np.ndarray, np.ndarray]:
    """Two attention states over disjoint key sets merged into the state over their union (ATTN-LSE-7), in the
    spec's terms (natural log, -inf = no key): vLLM's `merge_attn_states` of a prefix and a suffix, once their
    lse has been mapped by `empty_as_spec`."""
    return merge_partials([out_a, out_b], [lse_a, lse_b])


def empty_as_spec(lse, empty: float) -> np.ndarray:
    """A convention's lse with `empty` (+inf for flash-attention and FlashMLA) for a row without keys, in the
    spec's terms: that value becomes -inf (ATTN-LSE-2, -5). Only a convention whose empty row is +inf has
    an lse of +inf that means "no key"; in the spec's terms +inf is an infinite mass."""
    lse = np.array(lse, dtype=np.float64)
    lse[lse == empty] = -np.inf
    return lse


def add_sink(out: np.ndarray, lse: np.ndarray, sink) -> tuple[np.ndarray, np.ndarray]:
    """(out, lse) of the same rows with a sink logit added to the denominator (ATTN-SINK-2):
    a sink is a chunk that outputs 0 with lse = sink. `sink` broadcasts against lse."""
    sink = np.broadcast_to(np.asarray(sink, dtype=np.float64), np.shape(lse))
    return merge_partials([out, np.zeros_like(np.asarray(out, dtype=np.float64))], [lse, sink])


def sink_factor(lse, sink) -> np.ndarray:
    """The factor 1 / (1 + exp(sink - lse)) by which a sink scales a row whose sink-free lse is `lse`
    (0 where lse is -inf: such a row outputs 0 either way)."""
    lse = np.asarray(lse, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        f = 1.0 / (1.0 + np.exp(np.asarray(sink, dtype=np.float64) - lse))
    return np.where(np.isneginf(lse), 0.0, f)
