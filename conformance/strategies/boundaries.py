"""The shape boundaries where real attention kernels branch, declared once: the draws and the docs table.

Kernels pick a code path by shape: query and key tiles of 64 and 128 rows, a split-KV path for short query
blocks against long histories, head-dim templates (64, 96, 128, 160, 192, 256, and MLA's 192/128 and
576/512), GQA packing of many query heads per KV head, batch blocking. A defect that lives on one of those
paths is invisible to cases that never reach it, and a size budget alone never does. `BOUNDARIES` lists
each boundary with the smallest shape that crosses it; `shapes()` in sizes.py draws one of them with
some probability (bending the size budget, never the implementation's declared scope), so every family
that draws its shapes there (plain, masks, sinks, ALiBi, windows, GQA, gradients) reaches them.

`note(case)` records, when ATTNCONF_BOUNDARY_LOG names a file, which boundaries each case that runs
crosses and which families it belongs to (tests/test_boundaries.py counts them over one ci run);
boundaries_table.py renders spec/BOUNDARIES.md from this declaration.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

from attnconf.reference import Case

LOG_ENV = "ATTNCONF_BOUNDARY_LOG"
TEMPLATES = (64, 96, 128, 160, 192, 256, 512, 576)
FAMILIES = ("plain", "sinks", "alibi", "window", "gqa", "gradients", "causal")


@dataclass(frozen=True)
class Boundary:
    """One branch point: dimension `dim` at `at` (`kind`: tile, split, template, pack, block); `shape` is the
    small shape drawn to cross it, `crossed` how a case's shape is said to have crossed it."""

    id: str
    dim: str
    at: int
    kind: str
    why: str
    shape: dict[str, int] = field(hash=False)

    def crossed(self, s: dict[str, int]) -> bool:
        value = s["Hq"] // s["Hkv"] if self.dim == "group" else s[self.dim] if self.dim in s else None
        if self.kind == "template":
            return value == self.at and all(s[k] == v for k, v in self.shape.items() if k in ("Dk", "Dv"))
        if self.kind == "split":
            return s["Lk"] > self.at and s["Lq"] <= 16
        if self.kind == "tile2d":        # a head-dim template with more than one query tile
            return s["Dk"] == self.at and s["Dv"] == self.at and s["Lq"] > 64
        return value is not None and value > self.at


def _s(B=1, Hq=2, Hkv=2, Lq=17, Lk=33, Dk=32, Dv=None) -> dict[str, int]:
    return {"B": B, "Hq": Hq, "Hkv": Hkv, "Lq": Lq, "Lk": Lk, "Dk": Dk, "Dv": Dk if Dv is None else Dv}


BOUNDARIES: tuple[Boundary, ...] = (
    Boundary("B>4", "B", 4, "block", "batch blocked by 4 (a defect in the second block)", _s(B=5)),
    Boundary("B>8", "B", 8, "block", "batch blocked by 8", _s(B=9, Lq=9, Lk=17)),
    Boundary("group>8", "group", 8, "pack", "more than 8 query heads per KV head (GQA packing)", _s(Hq=16, Hkv=1, Lq=9)),
    Boundary("group>16", "group", 16, "pack", "GQA packing past 16", _s(Hq=64, Hkv=2, Lq=5, Lk=17, Dk=16)),
    Boundary("group>64", "group", 64, "pack", "MQA with 128 query heads on one KV head", _s(Hq=128, Hkv=1, Lq=3, Lk=17, Dk=16)),
    Boundary("Lq>64", "Lq", 64, "tile", "a second query tile of 64", _s(Lq=65, Lk=65)),
    Boundary("Lq>128", "Lq", 128, "tile", "a second query tile of 128", _s(Lq=129, Lk=129)),
    Boundary("Lk>64", "Lk", 64, "tile", "a second key tile of 64", _s(Lq=9, Lk=65)),
    Boundary("Lk>128", "Lk", 128, "tile", "a second key tile of 128", _s(Lq=9, Lk=129)),
    Boundary("split-KV", "Lk", 1024, "split", "2 <= Lq <= 16 against Lk > 1024: split-KV decode and merge",
             _s(Lq=8, Lk=1025, Dk=64)),
    Boundary("split-KV-2048", "Lk", 2048, "split", "a longer split (several KV splits)", _s(Lq=2, Lk=2049, Dk=64)),
    *(Boundary(f"D={d}", "Dk", d, "template", f"head-dim template {d}", _s(Lq=9, Lk=17, Dk=d)) for d in TEMPLATES),
    Boundary("Dk=192,Dv=128", "Dk", 192, "template", "MLA prefill (192 / 128)", _s(Lq=9, Lk=17, Dk=192, Dv=128)),
    Boundary("Dk=576,Dv=512", "Dk", 576, "template", "MLA decode (576 / 512)", _s(Lq=3, Lk=17, Dk=576, Dv=512)),
    Boundary("Dk>256", "Dk", 256, "tile", "past the largest common template (fallback path)", _s(Lq=9, Lk=17, Dk=257)),
    Boundary("D=256,Lq>64", "Dk", 256, "tile2d", "a second query tile of the 256 template",
             _s(Hq=1, Hkv=1, Lq=129, Lk=33, Dk=256)),
)
BY_ID = {b.id: b for b in BOUNDARIES}


@st.composite
def boundary_shapes(draw, *, gqa: bool, cross: bool, dv_ne_dk: bool, max_len: int, head_dims: tuple[int, ...] | None,
                    max_seqlen: int | None, max_head_dim: int | None) -> dict[str, int] | None:
    """One boundary's shape, or None if none fits the strategy's switches and the declared scope. Lengths
    past `max_len` are allowed (the size budget bends) unless the strategy asked for tiny cases (< 65)."""
    def fits(b: Boundary) -> bool:
        s = b.shape
        if (s["Hq"] != s["Hkv"] and not gqa) or (s["Lq"] != s["Lk"] and not cross) or (s["Dk"] != s["Dv"] and not dv_ne_dk):
            return False
        if max(s["Lq"], s["Lk"]) > max_len and max_len < 65:
            return False
        if max_seqlen is not None and max(s["Lq"], s["Lk"]) > max_seqlen:
            return False
        if head_dims is not None and (s["Dk"] not in head_dims or s["Dv"] not in head_dims):
            return False
        return max_head_dim is None or max(s["Dk"], s["Dv"]) <= max_head_dim

    pool = [b for b in BOUNDARIES if fits(b)]
    if not pool:
        return None
    # uniform through a seeded generator: Hypothesis's own choices lean on the first entries and on small
    # integers (measured over one derandomized ci run: the first boundary drawn 40 times as often as most)
    pick = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(len(pool))
    shape = dict(pool[int(pick)].shape)
    if gqa and shape["Hq"] == shape["Hkv"] == 2 and draw(st.booleans()):    # the same boundary, grouped
        shape["Hkv"] = 1
    if shape["Lq"] == 8 and shape["Lk"] > 1024:            # the split-KV query block: 2 to 16 rows
        shape["Lq"] = draw(st.sampled_from((2, 4, 8, 16)))
    return shape


def families(case: Case) -> list[str]:
    out = [f for f, on in (("sinks", case.sinks is not None), ("alibi", case.alibi_slopes is not None),
                           ("window", case.window is not None), ("gqa", case.shape["Hq"] > case.shape["Hkv"]),
                           ("gradients", case.grad_out is not None), ("causal", case.causal is not None)) if on]
    return out or ["plain"]


def crossed(case: Case) -> list[str]:
    return [b.id for b in BOUNDARIES if b.crossed(case.shape)]


def note(case: Any) -> None:
    """Append the boundaries `case` crosses to the file ATTNCONF_BOUNDARY_LOG names (nothing if unset)."""
    path = os.environ.get(LOG_ENV)
    if not path or not isinstance(case, Case):
        return
    hit = crossed(case)
    if hit:
        with open(path, "a") as f:
            f.write(json.dumps({"families": families(case), "crossed": hit}) + "\n")
