"""The shape palette: the few shapes an implementation that compiles every new shape is run on.

JAX, XLA Keras, flax, equinox, torch's flex attention and tinygrad compile a program for every new input
shape (adapters declare it: `example_budget` < 1). Drawn freely, nearly every example of such a run has a
shape of its own (a jax ci run: 71 shapes in 81 examples of test_output_matches_reference), so most of the
run is compiling. Within a run the strategies therefore draw those implementations' shapes from this
palette, per family of inputs (plain, cross, tall, GQA, MQA, Dv != Dk, long histories, decode:
`palette_shapes` filters it by what the strategy and the declared scope allow), so that an example reuses
the program of an earlier one with the same call signature. Values, masks, biases, lengths, regimes and
dtypes are drawn as before, and they are part of that signature too (the dtype, the shapes of masks,
biases and lengths, causal): measured in ci runs, the palette cuts the distinct shapes about 3x and the
distinct signatures far less (README, "Speed").

What the free draws reach, the palette keeps: the odd lengths (1, 3, 5, 7, 13, 17, 31, 33), the block
boundaries (63/64/65, 127/128/129, 255/257, 385), long histories against 2..16 queries (513, 1024), odd and
uncommon head dims (1, 3, 5, 40, 72, 80, 104, 200), Dv != Dk, GQA groups of 2, 3, 4 and 8, batches of 1 to 3,
and every shape of boundaries.py's BOUNDARIES (tiles, split-KV, head-dim templates, GQA
packing, batch blocking), with the variants `boundaries.boundary_shapes` draws of them. Shapes stay inside
strategies.BUDGET (the boundary shapes bend it, as they do in every run). The coverage floor is untouched:
the number of examples per cell is decided by the harness, not here.

`ENV` ("1": every implementation, "0": none) overrides the adapters' declaration, so that the catalogue's
kernels can be run on the palette to show that it finds every bug the free draws find.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
from hypothesis import strategies as st

from attnconf.conformance.strategies.boundaries import BOUNDARIES, Boundary

ENV = "ATTNCONF_PALETTE"
DIMS = ("B", "Hq", "Hkv", "Lq", "Lk", "Dk", "Dv")

# (B, Hq, Hkv, Lq, Lk, Dk, Dv); comments say which family or corner each row is for
_BASE = (
    # self-attention (Lq == Lk): every odd and block-boundary length, every odd head dim
    (1, 1, 1, 1, 1, 8, 8),
    (2, 2, 2, 3, 3, 1, 1),
    (1, 2, 2, 7, 7, 16, 16),
    (1, 2, 2, 5, 5, 256, 256),
    (1, 1, 1, 17, 17, 96, 96),
    (1, 2, 2, 33, 33, 128, 128),
    (1, 1, 1, 9, 9, 160, 160),
    (3, 1, 1, 13, 13, 5, 5),
    (2, 3, 3, 17, 17, 40, 40),
    (1, 2, 2, 31, 31, 3, 3),
    (2, 2, 2, 33, 33, 64, 64),
    (1, 8, 8, 16, 16, 8, 8),
    (1, 1, 1, 47, 47, 200, 200),
    (1, 2, 2, 63, 63, 72, 72),
    (1, 1, 1, 64, 64, 32, 32),
    (2, 2, 2, 65, 65, 16, 16),
    (1, 1, 1, 81, 81, 80, 80),
    (1, 2, 2, 127, 127, 8, 8),
    (1, 1, 1, 128, 128, 40, 40),
    (1, 1, 1, 129, 129, 32, 32),
    (1, 1, 1, 255, 255, 8, 8),
    (1, 1, 1, 257, 257, 4, 4),
    (1, 1, 1, 385, 385, 2, 2),
    # cross (Lq < Lk) and long histories against a short query block (split-KV paths)
    (1, 2, 2, 1, 33, 8, 8),
    (2, 2, 2, 5, 17, 16, 16),
    (1, 1, 1, 9, 65, 32, 32),
    (1, 1, 1, 17, 33, 104, 104),
    (2, 2, 2, 13, 255, 16, 16),
    (1, 1, 1, 4, 513, 64, 64),
    (1, 2, 2, 16, 1024, 8, 8),
    # tall (Lq > Lk): bottom-right causal rows that see no key
    (1, 2, 2, 17, 5, 8, 8),
    (1, 1, 1, 8, 3, 1, 1),
    (2, 2, 2, 33, 7, 16, 16),
    (1, 1, 1, 65, 31, 8, 8),
    (1, 2, 2, 129, 64, 8, 8),
    # Dv != Dk
    (1, 2, 2, 7, 13, 16, 8),
    (2, 2, 2, 17, 17, 8, 40),
    (1, 1, 1, 33, 65, 64, 16),
    (1, 3, 3, 1, 17, 3, 5),
    # GQA: groups of 2, 3 and 4 over 2, 3 and 8 KV heads, self, cross and tall
    (1, 4, 2, 7, 7, 8, 8),
    (2, 6, 2, 13, 33, 16, 16),
    (1, 12, 3, 17, 17, 8, 8),
    (1, 16, 8, 5, 9, 8, 8),
    (1, 8, 2, 33, 64, 4, 4),
    (1, 6, 3, 65, 65, 8, 8),
    (2, 4, 2, 31, 9, 16, 16),
    (1, 6, 2, 2, 513, 16, 16),
    # MQA: one KV head, groups of 2, 4 and 8
    (1, 2, 1, 9, 17, 16, 16),
    (2, 4, 1, 1, 13, 8, 8),
    (1, 8, 1, 33, 33, 8, 8),
    (1, 8, 1, 64, 65, 8, 8),
    (1, 4, 1, 17, 3, 8, 8),
    (1, 8, 1, 8, 1024, 8, 8),
    # decode: one query against the KV lengths of strategies.DECODE_LENGTHS, groups of 1, 4 and 8
    (2, 8, 2, 1, 2, 64, 64),
    (1, 4, 1, 1, 17, 128, 128),
    (3, 2, 2, 1, 127, 32, 32),
    (1, 8, 1, 1, 128, 64, 64),
    (2, 4, 1, 1, 129, 8, 8),
    (1, 2, 2, 1, 255, 128, 128),
    (1, 16, 2, 1, 256, 32, 32),
    (2, 2, 2, 1, 257, 64, 64),
    (1, 8, 1, 1, 511, 32, 32),
    (1, 4, 1, 1, 1023, 64, 64),
    (1, 2, 2, 1, 1024, 128, 128),
    (1, 1, 1, 1, 2049, 64, 64),
    (1, 8, 1, 1, 4096, 8, 8),
)
BASE: tuple[dict[str, int], ...] = tuple(dict(zip(DIMS, row)) for row in _BASE)


def boundary_variants(b: Boundary) -> list[dict[str, int]]:
    """The shapes `boundaries.boundary_shapes` can draw for `b`: its shape, grouped (Hkv 1) where it has
    two heads of each, and every split-KV query block (2, 4, 8, 16)."""
    out = [dict(b.shape)]
    if b.shape["Lq"] == 8 and b.shape["Lk"] > 1024:
        out = [{**b.shape, "Lq": n} for n in (2, 4, 8, 16)]
    if b.shape["Hq"] == b.shape["Hkv"] == 2:
        out += [{**s, "Hkv": 1} for s in out]
    return out


BOUNDARY_SHAPES: tuple[dict[str, int], ...] = tuple(s for b in BOUNDARIES for s in boundary_variants(b))
PALETTE: tuple[dict[str, int], ...] = BASE + BOUNDARY_SHAPES
KEYS = frozenset(tuple(s[d] for d in DIMS) for s in PALETTE)
LENGTHS: tuple[int, ...] = tuple(sorted({s[d] for s in PALETTE for d in ("Lq", "Lk")}))


def key(shape: dict[str, int]) -> tuple[int, ...]:
    return tuple(shape[d] for d in DIMS)


def contains(shape: dict[str, int]) -> bool:
    """Whether `shape` is a palette shape (the kv_covers_q swap of one counts: it keeps the sizes)."""
    k = key(shape)
    return k in KEYS or (k[:3] + (k[4], k[3]) + k[5:]) in KEYS


WIDE_FROM = 100      # max_examples from which a run searches widely (the thorough profile: 300)


def wide() -> bool:
    """Whether this run's profile searches widely (thorough): then no budget narrows what is drawn, neither
    the palette nor the branch-point sweep's rotation of dtypes (conformance/test_branch_points.py)."""
    from hypothesis import settings

    return settings.default.max_examples >= WIDE_FROM


def on(adapter: Any) -> bool:
    """Whether `adapter`'s cases are drawn from the palette: it compiles every new shape (example_budget
    < 1) and the profile is not a wide search (`wide`), unless ATTNCONF_PALETTE says otherwise for every
    implementation."""
    forced = os.environ.get(ENV, "")
    if forced in ("0", "1"):
        return forced == "1"
    return getattr(adapter, "example_budget", 1.0) < 1.0 and not wide()


@st.composite
def palette_shapes(draw, *, gqa: bool, cross: bool, dv_ne_dk: bool, max_len: int, head_dims: tuple[int, ...] | None,
                   max_seqlen: int | None, max_head_dim: int | None,
                   require: Callable[[dict[str, int]], bool] | None = None) -> dict[str, int] | None:
    """One base shape of the palette that the strategy's switches, `require` (a family: tall, GQA, B >= 2)
    and the declared scope allow, or None if none does (the caller then draws freely). Lengths stay
    within `max_len`: the boundaries past it come from `boundaries.boundary_shapes`, as in every run."""
    def fits(s: dict[str, int]) -> bool:
        if (s["Hq"] != s["Hkv"] and not gqa) or (s["Lq"] != s["Lk"] and not cross) or (s["Dk"] != s["Dv"] and not dv_ne_dk):
            return False
        if max(s["Lq"], s["Lk"]) > min(max_len, max_seqlen or max_len):
            return False
        if head_dims is not None and (s["Dk"] not in head_dims or s["Dv"] not in head_dims):
            return False
        if max_head_dim is not None and max(s["Dk"], s["Dv"]) > max_head_dim:
            return False
        return require is None or require(s)

    pool = [s for s in BASE if fits(s)]
    if not pool:
        return None
    # grouped three draws in four, as strategies.shapes() draws freely (groups 2, 4, 8 of GROUPS): uniform
    # over the palette, a cell of a few examples met GQA too rarely and topped itself up (tinygrad ci)
    if gqa and draw(st.integers(0, 3)) > 0:
        pool = [s for s in pool if s["Hq"] > s["Hkv"]] or pool
    # uniform through a seeded generator, as boundaries.boundary_shapes draws (Hypothesis leans on the first)
    return dict(pool[int(np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(len(pool)))])
