"""Pinned cases: one small deterministic case per way kernels break, run before any random draw."""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from attnconf.conformance.strategies.values import values
from attnconf.reference import Case


def fixed_case(seed: int = 0, *, B=1, Hq=2, Hkv=None, Lq=5, Lk=7, Dk=8, Dv=None, dtype="float32", **params) -> Case:
    """A small deterministic case for @example pins and witnesses."""
    rng = np.random.default_rng(seed)
    s = {"B": B, "Hq": Hq, "Hkv": Hkv or Hq, "Lq": Lq, "Lk": Lk, "Dk": Dk, "Dv": Dv or Dk}
    q, k, v = values(rng, s, params.pop("regime", "ordinary"), dtype)
    return Case.build(q, k, v, dtype=dtype, seed=seed, **params)


# Keyword arguments of `fixed_case`. The agreement tests run them as explicit examples in their own
# dtype; conformance/test_first_look.py runs all of them in every dtype before any other test, so
# that most bugs show in the first second of a run.
AGREEMENT_PINS: tuple[dict[str, Any], ...] = (
    dict(seed=1, Lq=1, Lk=1, Dk=1),
    dict(seed=2, B=2, Hq=4, Hkv=1, Lq=17, Lk=33, Dk=40, Dv=24, causal="bottom_right"),
    dict(seed=3, Lq=9, Lk=4, Dk=16, causal="bottom_right", dtype="float16"),
    dict(seed=4, Lq=129, Lk=65, Dk=64, dtype="bfloat16", regime="large"),
    dict(seed=5, Lq=8, Lk=8, dtype="float64", kv_lengths=[3], q_lengths=[6]),
    dict(seed=6, Hq=2, Lq=5, Lk=11, Dk=16, causal="bottom_right"),
    dict(seed=7, B=2, Lq=6, Lk=9, Dk=16, mask=np.random.default_rng(7).random((2, 1, 1, 9)) < 0.5),
    dict(seed=8, Lq=7, Lk=7, Dk=16, causal="top_left", dtype="float64"),
    dict(seed=9, B=2, Hq=2, Lq=5, Lk=9, Dk=16, causal="top_left"),
    dict(seed=10, Hq=2, Lq=9, Lk=5, Dk=8, causal="top_left", dtype="float64"),
    dict(seed=11, Hq=2, Lq=6, Lk=7, Dk=16, Dv=8, scale=0.3),
    dict(seed=12, B=2, Hq=2, Lq=6, Lk=8, Dk=16, bias=2.0 * np.random.default_rng(12).standard_normal((2, 1, 6, 8))),
    dict(seed=13, Hq=1, Lq=5, Lk=257, Dk=256),                 # a wide head over several key blocks
    dict(seed=14, Hq=16, Hkv=8, Lq=3, Lk=9, Dk=8),             # more than four KV heads, in pairs
    dict(seed=15, Hq=2, Lq=4, Lk=1024, Dk=32),                 # a short query block over a long history
    dict(seed=16, Hq=2, Lq=3, Lk=6, Dk=8, scale=0.0),          # scale 0 is given, not the default
    dict(seed=17, Hq=2, Lq=16, Lk=200, Dk=256, regime="overflow"),  # a wide V head, row max rising in later blocks
    dict(seed=18, Hq=2, Lq=6, Lk=7, Dk=16, scale=-0.5),        # a negative scale over several keys
    dict(seed=19, Hq=1, Lq=530, Lk=530, Dk=8, causal="top_left"),   # causal past 512 query rows
    dict(seed=20, B=5, Hq=1, Lq=4, Lk=6, Dk=8, mask=np.random.default_rng(20).random((5, 1, 4, 6)) < 0.5),  # B > 4
    dict(seed=21, B=2, Hq=2, Lq=5, Lk=6, Dk=8, mask=np.random.default_rng(21).random((2, 5, 6)) < 0.5),  # 3-D: (Hq, ., .)
)
# for the calling conventions of modern kernels; `scope_fit.fit` adapts each to the kernel's scope
# (a decode kernel gets its last query row, a flash-attention kernel loses the mask, ...)
CONVENTION_PINS: tuple[dict[str, Any], ...] = (
    dict(seed=61, B=2, Hq=4, Hkv=2, Lq=5, Lk=11, Dk=16, window=(2, 1), causal="bottom_right"),
    dict(seed=62, B=1, Hq=2, Lq=9, Lk=9, Dk=8, window=(1, 2)),
    dict(seed=63, B=2, Hq=2, Lq=7, Lk=4, Dk=16, window=(0, 2)),                  # rows with no key
    dict(seed=64, B=1, Hq=4, Hkv=1, Lq=6, Lk=6, Dk=32, softcap=1.0, regime="large", causal="bottom_right"),
    dict(seed=65, B=2, Hq=4, Lq=6, Lk=13, Dk=16, alibi_slopes=np.array([1.0, 0.5, 0.25, 0.125])),
    dict(seed=66, B=2, Hq=2, Lq=13, Lk=6, Dk=8, alibi_slopes=np.array([[0.3, 0.9], [1.5, 0.1]]),
         causal="bottom_right", softcap=5.0),
    dict(seed=67, B=3, Hq=4, Hkv=2, Lq=7, Lk=9, Dk=8, q_lengths=[3, 7, 5], kv_lengths=[9, 2, 6],
         causal="bottom_right", packing={"seq_order": [0, 1, 2], "new_keys": 2, "page_size": 0}),
    dict(seed=68, B=2, Hq=2, Lq=4, Lk=12, Dk=16, kv_lengths=[5, 12], window=(3, -1),
         packing={"seq_order": [0, 1], "new_keys": 1, "page_size": 256, "block_seed": 3}),
    dict(seed=69, B=2, Hq=2, Lq=6, Lk=10, Dk=8, mask=np.random.default_rng(60).random((2, 1, 6, 10)) < 0.5),
    dict(seed=70, B=1, Hq=2, Lq=1, Lk=33, Dk=64, window=(7, -1), dtype="bfloat16"),   # decode
    dict(seed=71, B=1, Hq=2, Lq=200, Lk=300, Dk=16, window=(16, -1)),   # a window across 128-key blocks
    # a pack whose longest sequence fills whole 64/128/256-key blocks while a shorter one before it does not
    dict(seed=72, B=3, Hq=2, Lq=8, Lk=256, Dk=64, q_lengths=[8, 5, 8], kv_lengths=[10, 256, 37],
         packing={"seq_order": [0, 1, 2]}),
)


def pinned(pins: Iterable[dict[str, Any]], dtype: str | None = None) -> list[Case]:
    """The pinned cases, each in its own dtype or all in `dtype` (inputs drawn for that dtype)."""
    return [fixed_case(**{**p, "dtype": dtype or p.get("dtype", "float32")}) for p in pins]
