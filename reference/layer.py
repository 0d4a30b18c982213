"""The multi-head attention layer (ATTN-MHA-1) in float64, and its dtype baseline.

A `LayerCase` is one layer problem: inputs X_q, X_k, X_v (B, L, E), projections
W_Q, W_K, W_V, W_O (E, E) applied as y = x @ W + b, and the head count. `mha`
projects, splits E into num_heads heads of width d = E // num_heads (head h uses
columns h*d .. (h+1)*d), runs the one attention definition of
`reference.attention.forward` per head, concatenates and projects out. Framework
layers store their weights differently (transposed, packed, per-head tensors); the
adapters translate, this module fixes the meaning.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .attention import forward
from .case import LOADERS, Case, CaseError, numpy_dtype, round_to
from .emulate import VARIANTS, _rounder, naive_forward, seq_matmul

_INPUTS = ("x_q", "x_k", "x_v")
_WEIGHTS = ("w_q", "w_k", "w_v", "w_o")
_BIASES = ("b_q", "b_k", "b_v", "b_o")


@dataclass(frozen=True, eq=False)
class LayerCase:
    """One multi-head attention layer problem. Build validated, dtype-rounded cases with `build`."""

    x_q: np.ndarray
    x_k: np.ndarray
    x_v: np.ndarray
    w_q: np.ndarray
    w_k: np.ndarray
    w_v: np.ndarray
    w_o: np.ndarray
    b_q: np.ndarray | None = None
    b_k: np.ndarray | None = None
    b_v: np.ndarray | None = None
    b_o: np.ndarray | None = None
    num_heads: int = 1
    mask: np.ndarray | None = None
    causal: str | None = None
    dtype: str = "float64"
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def build(cls, x_q, x_k, x_v, w_q, w_k, w_v, w_o, **params: Any) -> "LayerCase":
        """Validate and round every float input, weight and bias to `dtype`."""
        dtype = params.get("dtype", "float64")
        numpy_dtype(dtype)
        given = dict(zip(_INPUTS + _WEIGHTS, (x_q, x_k, x_v, w_q, w_k, w_v, w_o)))
        given.update({n: params.pop(n) for n in _BIASES if params.get(n) is not None})
        for name, arr in given.items():
            params[name] = round_to(np.asarray(arr, dtype=np.float64), dtype)
        if params.get("mask") is not None:
            params["mask"] = np.asarray(params["mask"], dtype=bool)
        lc = cls(**params)
        lc.validate()
        return lc

    def replace(self, **changes: Any) -> "LayerCase":
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "_cache"}
        fields.update(changes)
        pos = [fields.pop(n) for n in _INPUTS + _WEIGHTS]
        return LayerCase.build(*pos, **fields)

    def validate(self) -> None:
        """Raise CaseError (one line) if the layer problem is inconsistent."""
        if self.x_q.ndim != 3 or self.x_k.ndim != 3 or self.x_v.ndim != 3:
            raise CaseError(f"x_q, x_k, x_v must be (B, L, E); got {self.x_q.shape}, {self.x_k.shape}, {self.x_v.shape}")
        B, Lq, E = self.x_q.shape
        if self.x_k.shape != (B, self.x_k.shape[1], E) or self.x_v.shape != self.x_k.shape:
            raise CaseError(f"x_k {self.x_k.shape} and x_v {self.x_v.shape} must both be (B={B}, Lk, E={E})")
        if not isinstance(self.num_heads, (int, np.integer)) or self.num_heads < 1 or E % self.num_heads:
            raise CaseError(f"E={E} is not divisible by num_heads={self.num_heads}")
        for name in _WEIGHTS:
            if getattr(self, name).shape != (E, E):
                raise CaseError(f"{name} must be ({E}, {E}); got {getattr(self, name).shape}")
        for name in _BIASES:
            b = getattr(self, name)
            if b is not None and b.shape != (E,):
                raise CaseError(f"{name} must be ({E},); got {b.shape}")
        if self.mask is not None and self.mask.shape != (B, Lq, self.x_k.shape[1]):
            raise CaseError(f"mask must be (B, Lq, Lk) = {(B, Lq, self.x_k.shape[1])}; got {self.mask.shape}")
        if self.causal not in (None, "top_left"):
            raise CaseError(f"the layer's causal must be None or 'top_left'; got {self.causal!r}")

    def features(self) -> set[str]:
        """The spec features this layer case exercises (capability names, see adapters.base)."""
        f = set()
        if self.mask is not None:
            f.add("mask")
        if self.x_q.shape[1] != self.x_k.shape[1]:
            f.add("cross")
        if self.causal is not None:
            f.add("causal_" + self.causal)
            if self.mask is not None:
                f.add("mask_with_causal")
        return f

    @property
    def head_dim(self) -> int:
        return self.x_q.shape[2] // self.num_heads

    def summary(self) -> str:
        B, Lq, E = self.x_q.shape
        biases = "".join(n[-1] for n in _BIASES if getattr(self, n) is not None) or "none"
        mask = "none" if self.mask is None else f"bool{list(self.mask.shape)}"
        return (f"layer B={B} Lq={Lq} Lk={self.x_k.shape[1]} E={E} heads={self.num_heads} {self.dtype} "
                f"biases={biases} mask={mask} causal={self.causal}")

    def _arrays(self) -> dict[str, np.ndarray]:
        names = (*_INPUTS, *_WEIGHTS, *_BIASES, "mask")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def digest(self) -> str:
        import hashlib
        import json

        h = hashlib.sha256()
        for name, arr in sorted(self._arrays().items()):
            h.update(name.encode() + str(arr.shape).encode() + np.ascontiguousarray(arr).tobytes())
        h.update(json.dumps([self.num_heads, self.causal, self.dtype]).encode())
        return h.hexdigest()[:16]

    def save(self, path):
        """Write as .npz: arrays by name plus a JSON `params` entry (kind = "layer")."""
        import json
        from pathlib import Path

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        params = {"kind": "layer", "num_heads": int(self.num_heads), "causal": self.causal, "dtype": self.dtype}
        np.savez(path, params=np.array(json.dumps(params)), **self._arrays())
        return path

    @classmethod
    def from_npz(cls, data, params: dict) -> "LayerCase":
        arrays = {n: data[n] for n in data.files if n != "params"}
        pos = [arrays.pop(n) for n in _INPUTS + _WEIGHTS]
        params = {k: v for k, v in params.items() if k != "kind"}
        return cls.build(*pos, **arrays, **params)

    def describe(self) -> dict[str, Any]:
        """JSON-ready parameters (no arrays) for records and reports."""
        B, Lq, E = self.x_q.shape
        return {"B": B, "Lq": Lq, "Lk": self.x_k.shape[1], "E": E, "num_heads": self.num_heads,
                "dtype": self.dtype, "biases": [n for n in _BIASES if getattr(self, n) is not None],
                "mask": None if self.mask is None else list(self.mask.shape), "causal": self.causal}


LOADERS["layer"] = LayerCase.from_npz


def _split(y: np.ndarray, h: int) -> np.ndarray:
    """(B, L, E) -> (B, h, L, E // h): head i takes columns i*d .. (i+1)*d."""
    B, L, E = y.shape
    return y.reshape(B, L, h, E // h).transpose(0, 2, 1, 3)


def _merge(o: np.ndarray) -> np.ndarray:
    """(B, h, L, d) -> (B, L, h*d), heads concatenated in order."""
    B, h, L, d = o.shape
    return o.transpose(0, 2, 1, 3).reshape(B, L, h * d)


def _project(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = x @ w
    return y if b is None else y + b


def _head_mask(lc: LayerCase) -> np.ndarray | None:
    return None if lc.mask is None else lc.mask[:, None]


def mha(lc: LayerCase, attend=None) -> np.ndarray:
    """The layer output (B, Lq, E) in float64; cached on the LayerCase.

    `attend(q, k, v, mask=, causal=)` replaces the per-head attention (a divergence's alternative
    semantics, e.g. another scale); its result is not cached."""
    cached = lc._cache.get("mha")
    if cached is not None and attend is None:
        return cached
    h = lc.num_heads
    q = _split(_project(lc.x_q, lc.w_q, lc.b_q), h)
    k = _split(_project(lc.x_k, lc.w_k, lc.b_k), h)
    v = _split(_project(lc.x_v, lc.w_v, lc.b_v), h)
    if attend is not None:
        return _project(_merge(attend(q, k, v, mask=_head_mask(lc), causal=lc.causal)), lc.w_o, lc.b_o)
    o = forward(q, k, v, mask=_head_mask(lc), causal=lc.causal).out
    cached = lc._cache["mha"] = _project(_merge(o), lc.w_o, lc.b_o)
    return cached


def _naive_layer(lc: LayerCase, dtype: str, matmul, attend) -> np.ndarray:
    """The layer as a naive implementation at `dtype` computes it: each projection `matmul(x, W)` of
    float32 arrays, plus the bias, rounded to dtype; `attend(case)` on the rounded per-head Q, K, V."""
    r = _rounder(dtype)
    f32 = np.float32

    def project(x, w, b):
        y = matmul(x.astype(f32), w.astype(f32))
        return r(y if b is None else y + b.astype(f32)).astype(np.float64)

    h = lc.num_heads
    with np.errstate(all="ignore"):
        q = _split(project(lc.x_q, lc.w_q, lc.b_q), h)
        k = _split(project(lc.x_k, lc.w_k, lc.b_k), h)
        v = _split(project(lc.x_v, lc.w_v, lc.b_v), h)
        case = Case.build(q, k, v, mask=_head_mask(lc), causal=lc.causal, dtype=dtype)
        return project(_merge(attend(case)), lc.w_o, lc.b_o)


def naive_mha(lc: LayerCase, dtype: str | None = None,
              variant: tuple[str, str, str] = ("q", "divide", "blas")) -> np.ndarray:
    """The layer at `dtype` (default: the case's) as one naive variant computes it, float64.

    Each projection is a float32-accumulated x @ W + b (summed in the variant's order) rounded
    to dtype; attention is `reference.emulate.naive_forward` of the same variant on the rounded
    per-head Q, K, V.
    """
    dtype = dtype or lc.dtype
    if dtype == "float64":
        raise ValueError("there is no emulated baseline for float64; use the analytic bound")
    key = ("naive_mha", dtype, variant)
    if key not in lc._cache:
        lc._cache[key] = _naive_layer(lc, dtype, lambda a, b: seq_matmul(a, b, variant[2]),
                                      lambda case: naive_forward(case, variant)[0])
    return lc._cache[key]


def naive_mha_half_accumulation(lc: LayerCase, order: str = "ascending", scaling: str = "q") -> np.ndarray:
    """The layer as a naive implementation computes it whose every dot product accumulates in the case's
    half type: the projections by `emulate.half_matmul` in `order`, each rounded to the dtype after the
    bias, and the attention by `emulate.naive_forward_half_accumulation` (same order, `scaling`). Not a
    yardstick of the spec: it states what a divergence's "accumulates in half precision" means for a layer."""
    from .emulate import half_matmul, naive_forward_half_accumulation

    key = ("naive_mha_half_accumulation", lc.dtype, order, scaling)
    if key not in lc._cache:
        lc._cache[key] = _naive_layer(lc, lc.dtype, lambda a, b: half_matmul(a, b, lc.dtype, order),
                                      lambda case: naive_forward_half_accumulation(case, order, scaling))
    return lc._cache[key]


def layer_half_accumulation_error(lc: LayerCase) -> np.ndarray:
    """emulate.half_accumulation_error for a layer: the envelope over the half-accumulating orders and
    scalings of |naive_mha_half_accumulation - mha|."""
    from .emulate import half_accumulation_envelope

    return half_accumulation_envelope(mha(lc), lambda o, s: naive_mha_half_accumulation(lc, o, s))


def layer_baseline_error(lc: LayerCase) -> np.ndarray:
    """Elementwise max over the naive variants (reference.emulate.VARIANTS) of |naive_mha - mha|,
    the same envelope over orders the spec leaves open as for attention alone."""
    key = ("layer_baseline_error", lc.dtype)
    if key not in lc._cache:
        ref = mha(lc)
        with np.errstate(all="ignore"):
            errs = [np.abs(naive_mha(lc, variant=v) - ref) for v in VARIANTS]
        lc._cache[key] = np.nan_to_num(np.max(errs, axis=0), nan=0.0, posinf=0.0)
    return lc._cache[key]


def random_layer_case(rng: np.random.Generator, B: int, Lq: int, Lk: int, E: int, num_heads: int,
                      dtype: str = "float64", biases: bool = True, mask=None,
                      causal: str | None = None) -> LayerCase:
    """A LayerCase with standard-normal inputs and weights scaled by 1/sqrt(E).

    `mask` is None, a (B, Lq, Lk) bool array, or "random" for a random mask in which
    every query row keeps at least one visible key.
    """
    x = [rng.standard_normal((B, L, E)) for L in (Lq, Lk, Lk)]
    w = [rng.standard_normal((E, E)) / np.sqrt(E) for _ in range(4)]
    b = {n: 0.1 * rng.standard_normal(E) for n in _BIASES} if biases else {}
    if isinstance(mask, str):
        if mask != "random":
            raise ValueError(f"mask must be None, an array or 'random'; got {mask!r}")
        mask = rng.random((B, Lq, Lk)) < 0.7
        mask[np.arange(B)[:, None], np.arange(Lq)[None, :], rng.integers(0, Lk, (B, Lq))] = True
    return LayerCase.build(*x, *w, num_heads=num_heads, mask=mask, causal=causal, dtype=dtype, **b)
