"""The inputs of ATTN-LONG-1: long causal cases whose answer hangs on a few keys, some of them far back.

N(0, 1) inputs at L in the thousands give a nearly uniform softmax, so a kernel returning the mean of V,
or one that scales by 1/d instead of 1/sqrt(d), or sees one future key, lands within any fair tolerance.
Here every query row i points along one of TOPICS orthogonal directions (its topic), and a few keys per
topic point the same way: their logits stand SHARP above the rest (whose logits spread about 1.4 around
0), so a row's output is a weighted mean of the values of its topic's visible sharp keys. The sharp keys
of a topic sit far back (one in the first 128 positions), spread over the sequence, just past
ALIAS_AT (positions 16384 and up, where a 14-bit key index wraps; these stand higher still, so the rows
past ALIAS_AT hang mostly on keys past it), on every sampled row itself and on the key right after it
(which the row must not see). Sampled are every boundary a kernel branches on (tile
edges, powers of two, one past them, the last rows) and random rows, more of them far back.
"""
from __future__ import annotations

import numpy as np

from attnconf.reference import Case

LONG_LENGTHS = (4097, 16385, 32769)     # one past a power of two: a partial last tile at every tile size
ALIAS_AT = 16384
HEAD_DIM = 64
TOPICS = 64
SHARP = 16.0                            # a sharp key's logit, after the 1/sqrt(d) scale
LATE_GAIN = 1.15                        # sharp keys past ALIAS_AT: logit about 18.4, e^2.4 = 11 x the weight
SAMPLED_ROWS = 64
FAR_BACK = 128


def sampled_rows(length: int, rng: np.random.Generator) -> np.ndarray:
    """Boundaries (0, 1, tile edges 63/64/65 ... 4096, ALIAS_AT +- 1, the last three rows) and random rows
    up to SAMPLED_ROWS in all, two thirds of the random ones in the last half (the most keys behind them)."""
    edges = {0, 1, 2, length - 3, length - 2, length - 1}
    for p in (64, 128, 256, 512, 1024, 2048, 4096, ALIAS_AT):
        edges |= {p - 1, p, p + 1}
    rows = {r for r in edges if 0 <= r < length}
    while len(rows) < SAMPLED_ROWS:
        half = rng.random() < 2 / 3
        rows.add(int(rng.integers(length // 2 if half else 0, length)))
    return np.array(sorted(rows), dtype=np.int64)


def long_case(length: int, dtype: str, rng: np.random.Generator, rows: np.ndarray) -> Case:
    """A top-left causal case (B = Hq = Hkv = 1, D = HEAD_DIM) built as the module docstring says."""
    d = HEAD_DIM
    amp = np.sqrt(SHARP * np.sqrt(d))   # q . k = amp^2 along a shared direction: logit SHARP after 1/sqrt(d)
    topic = rng.integers(TOPICS, size=length)
    q = rng.normal(scale=0.5, size=(length, d))
    q[np.arange(length), topic] += amp
    k = rng.normal(size=(length, d))
    key_topic = np.full(length, -1)
    key_topic[rng.choice(FAR_BACK, TOPICS, replace=False)] = np.arange(TOPICS)
    key_topic[rng.choice(length, 3 * TOPICS, replace=False)] = np.tile(np.arange(TOPICS), 3)
    if length > ALIAS_AT:
        span = min(length - ALIAS_AT, 2048)
        key_topic[ALIAS_AT + rng.choice(span, min(span, 2 * TOPICS), replace=False)] = \
            np.tile(np.arange(TOPICS), 2)[:min(span, 2 * TOPICS)]
    ahead = rows[rows + 1 < length]
    key_topic[ahead + 1] = topic[ahead]         # the first key a row must not see points its way
    key_topic[rows] = topic[rows]
    sharp = key_topic >= 0
    k[sharp] *= 0.25
    # past ALIAS_AT a sharp key stands LATE_GAIN higher still, so the rows there hang mostly on keys there
    gain = np.where(np.arange(length) >= ALIAS_AT, LATE_GAIN, 1.0)
    k[np.nonzero(sharp)[0], key_topic[sharp]] += amp * gain[sharp]
    v = rng.normal(size=(length, d))
    return Case.build(*(x[None, None] for x in (q, k, v)), dtype=dtype, causal="top_left", seed=length)
