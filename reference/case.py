"""The `Case`: one attention problem, as float64 NumPy inputs plus parameters.

A Case is the unit that flows through attnconf: strategies generate it, the
reference and an adapter both consume it, checkers compare what they return,
and a failing Case is saved as `.npz` so it can be replayed without attnconf.
Inputs are always float64 arrays whose values are exactly representable in
`dtype` (ATTN-DTYPE-1), so that rounding the inputs is never counted as error.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnconf.spec.vocabulary import ALIGNMENTS, DTYPES, LAYOUTS

CAUSAL = (None, *ALIGNMENTS)
_ARRAYS = ("q", "k", "v", "mask", "bias", "q_lengths", "kv_lengths", "grad_out", "alibi_slopes", "sinks")


def numpy_dtype(dtype: str) -> np.dtype:
    """The NumPy (or ml_dtypes) dtype object for a dtype name."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    return np.dtype(dtype)


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values to `dtype` and return them as float64 again."""
    x = np.asarray(x, dtype=np.float64)
    if dtype == "float64":
        return x
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(numpy_dtype(dtype)).astype(np.float64)


class CaseError(ValueError):
    """A Case whose parameters contradict each other (one-line message)."""


# Other kinds of saved case (a .npz whose params say "kind") register their loader here:
# reference/layer.py registers "layer". The reference package imports layer.py, so the loader is
# registered whenever `attnconf.reference` is, and case.py needs no import of layer.py (no cycle).
LOADERS: dict[str, Any] = {}


@dataclass(frozen=True, eq=False)
class Case:
    """One attention problem. Build validated, dtype-rounded cases with `Case.build`."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    mask: np.ndarray | None = None
    bias: np.ndarray | None = None
    causal: str | None = None
    scale: float | None = None
    q_lengths: np.ndarray | None = None
    kv_lengths: np.ndarray | None = None
    dtype: str = "float64"
    dropout_p: float = 0.0
    seed: int = 0
    layout: str = "contiguous"
    grad_out: np.ndarray | None = None
    regime: str = "ordinary"
    # Variants modern kernels implement (ATTN-WIN-*, ATTN-CAP-*, ATTN-ALIBI-*, ATTN-SINK-*):
    window: tuple[int, int] | None = None     # (left, right) keys around the aligned diagonal; -1 = unbounded
    window_align: str = "bottom_right"        # where the diagonal of `window` and of ALiBi distances sits
    softcap: float | None = None              # logits -> softcap * tanh(logits / softcap), before bias and masks
    alibi_slopes: np.ndarray | None = None    # (Hq,) or (B, Hq): adds -slope * |i + offset - j|
    sinks: np.ndarray | None = None           # (Hq,): a per-head logit that joins every row's softmax denominator
    chunk: int | None = None                  # chunked local attention (ATTN-CHUNK-1): keys in the query's chunk only
    # How a calling convention lays the same problem out (page size, block order, appended keys, ...):
    # it never changes the mathematics, only the representation a convention passes to a kernel.
    # Keys (adapters/conventions/*.py; a convention ignores the others, and draws a missing one from
    # the case seed within the kernel's declared scope):
    #   seq_order      flash_attn_varlen: permutation of the batch, the order sequences are packed in
    #   page_size      flash_attn_kvcache: 0 = contiguous cache, n > 0 = paged cache, blocks of n keys
    #   block_seed     flash_attn_kvcache: seed of the physical block (or cache row) permutation
    #   spare_blocks   flash_attn_kvcache: unused physical blocks / cache rows (filled with garbage)
    #   spare_slots    flash_attn_kvcache: cache capacity beyond the longest sequence
    #   new_keys       flash_attn_kvcache: the last n keys of every sequence are appended in the call
    #   cache_batch_idx  flash_attn_kvcache: bool, contiguous cache rows permuted via cache_batch_idx
    #   kv_layout      flashinfer_prefill / flashinfer_decode: "NHD" or "HND"
    packing: dict = field(default_factory=dict)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    # ---- construction -------------------------------------------------
    @classmethod
    def build(cls, q, k, v, **params: Any) -> "Case":
        """Validate the parameters and round every float input to `dtype`."""
        dtype = params.get("dtype", "float64")
        numpy_dtype(dtype)
        arrays = {"q": q, "k": k, "v": v}
        for name in ("bias", "grad_out", "alibi_slopes", "sinks"):
            if params.get(name) is not None:
                arrays[name] = params[name]
        for name, arr in arrays.items():
            params[name] = round_to(np.asarray(arr, dtype=np.float64), dtype)
        if params.get("mask") is not None:
            params["mask"] = np.asarray(params["mask"], dtype=bool)
        for name in ("q_lengths", "kv_lengths"):
            if params.get(name) is not None:
                params[name] = np.asarray(params[name], dtype=np.int64)
        if params.get("window") is not None:
            params["window"] = tuple(int(w) for w in params["window"])
        if params.get("softcap") is not None:
            params["softcap"] = float(params["softcap"])
        if params.get("chunk") is not None:
            params["chunk"] = int(params["chunk"])
        params["packing"] = dict(params.get("packing") or {})
        case = cls(**params)
        case.validate()
        return case

    def replace(self, **changes: Any) -> "Case":
        """A new Case with some fields changed (validated, inputs re-rounded)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "_cache"}
        fields.update(changes)
        q, k, v = fields.pop("q"), fields.pop("k"), fields.pop("v")
        return Case.build(q, k, v, **fields)

    def validate(self) -> None:
        """Raise CaseError (one line) if the case is not a valid attention problem."""
        q, k, v = self.q, self.k, self.v
        if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
            raise CaseError(f"q, k, v must be 4-D (B, H, L, D); got {q.shape}, {k.shape}, {v.shape}")
        B, Hq, Lq, Dk = q.shape
        if k.shape[0] != B or v.shape[0] != B:
            raise CaseError(f"batch mismatch: q {q.shape}, k {k.shape}, v {v.shape}")
        if k.shape[3] != Dk:
            raise CaseError(f"Dk mismatch: q has {Dk}, k has {k.shape[3]}")
        if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
            raise CaseError(f"k {k.shape} and v {v.shape} differ in heads or length")
        Hkv = k.shape[1]
        if Hkv == 0 or Hq % Hkv:
            raise CaseError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
        full = (B, Hq, Lq, k.shape[2])
        for name in ("mask", "bias"):
            arr = getattr(self, name)
            if arr is not None:
                if arr.ndim > 4:
                    raise CaseError(f"{name} has {arr.ndim} dims; at most 4")
                try:
                    np.broadcast_shapes(arr.shape, full)
                except ValueError:
                    raise CaseError(f"{name} shape {arr.shape} does not broadcast to {full}") from None
        if self.bias is not None and np.any(self.bias == np.inf):
            raise CaseError("bias holds +inf; only finite values and -inf are allowed")
        if self.causal not in CAUSAL:
            raise CaseError(f"causal must be one of {CAUSAL}; got {self.causal!r}")
        if self.layout not in LAYOUTS:
            raise CaseError(f"layout must be one of {LAYOUTS}; got {self.layout!r}")
        for name, limit in (("q_lengths", Lq), ("kv_lengths", k.shape[2])):
            arr = getattr(self, name)
            if arr is not None and (arr.shape != (B,) or arr.min() < 0 or arr.max() > limit):
                raise CaseError(f"{name} must be {B} integers in [0, {limit}]; got {arr.tolist()}")
        if not 0.0 <= self.dropout_p < 1.0:
            raise CaseError(f"dropout_p must be in [0, 1); got {self.dropout_p}")
        if self.grad_out is not None and self.grad_out.shape != (B, Hq, Lq, v.shape[3]):
            raise CaseError(f"grad_out shape {self.grad_out.shape} != output shape {(B, Hq, Lq, v.shape[3])}")
        if self.window is not None and (len(self.window) != 2 or min(self.window) < -1):
            raise CaseError(f"window must be (left, right) with each >= 0 or -1 (unbounded); got {self.window}")
        if self.window_align not in ALIGNMENTS:
            raise CaseError(f"window_align must be one of {ALIGNMENTS}; got {self.window_align!r}")
        if self.chunk is not None and self.chunk < 1:
            raise CaseError(f"chunk must be a positive number of keys; got {self.chunk}")
        if self.softcap is not None and not (np.isfinite(self.softcap) and self.softcap > 0):
            raise CaseError(f"softcap must be a finite number > 0; got {self.softcap}")
        if self.alibi_slopes is not None and self.alibi_slopes.shape not in ((Hq,), (B, Hq)):
            raise CaseError(f"alibi_slopes must have shape ({Hq},) or ({B}, {Hq}); got {self.alibi_slopes.shape}")
        if self.alibi_slopes is not None and not np.isfinite(self.alibi_slopes).all():
            raise CaseError("alibi_slopes must be finite")
        if self.sinks is not None and (self.sinks.shape != (Hq,) or not np.isfinite(self.sinks).all()):
            raise CaseError(f"sinks must be {Hq} finite logits, one per query head; got shape {self.sinks.shape}")

    # ---- derived quantities -------------------------------------------
    @property
    def shape(self) -> dict[str, int]:
        B, Hq, Lq, Dk = self.q.shape
        return {"B": B, "Hq": Hq, "Hkv": self.k.shape[1], "Lq": Lq, "Lk": self.k.shape[2], "Dk": Dk, "Dv": self.v.shape[3]}

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        s = self.shape
        return (s["B"], s["Hq"], s["Lq"], s["Dv"])

    @property
    def effective_scale(self) -> float:
        return float(self.scale) if self.scale is not None else 1.0 / np.sqrt(self.q.shape[3])

    def mask_kind(self) -> str:
        parts = []
        if self.mask is not None:
            parts.append(f"bool{list(self.mask.shape)}")
        if self.bias is not None:
            parts.append(f"bias{list(self.bias.shape)}" + ("-inf" if np.isneginf(self.bias).any() else ""))
        if self.causal:
            parts.append(f"causal={self.causal}")
        if self.kv_lengths is not None:
            parts.append(f"kv_len={self.kv_lengths.tolist()}")
        if self.q_lengths is not None:
            parts.append(f"q_len={self.q_lengths.tolist()}")
        if self.window is not None:
            parts.append(f"window={list(self.window)}@{self.window_align}")
        if self.chunk is not None:
            parts.append(f"chunk={self.chunk}@{self.window_align}")
        return "+".join(parts) or "none"

    def features(self) -> set[str]:
        """The spec features this case exercises beyond plain attention (scope names, see adapters.base)."""
        s = self.shape
        f = set()
        for name, on in (("mask", self.mask is not None), ("bias", self.bias is not None),
                         ("q_lengths", self.q_lengths is not None), ("kv_lengths", self.kv_lengths is not None),
                         ("gqa", s["Hkv"] != s["Hq"]), ("custom_scale", self.scale is not None),
                         ("dv_ne_dk", s["Dv"] != s["Dk"]), ("cross", s["Lq"] != s["Lk"]),
                         ("dropout", bool(self.dropout_p)), ("softcap", self.softcap is not None),
                         ("alibi", self.alibi_slopes is not None and self.window_align == "bottom_right"),
                         ("alibi_top_left", self.alibi_slopes is not None and self.window_align == "top_left"),
                         ("sinks", self.sinks is not None)):
            if on:
                f.add(name)
        if self.causal is not None:
            f.add("causal_" + self.causal)
            if self.mask is not None or self.bias is not None:
                f.add("mask_with_causal")
        if self.window is not None:
            f.add("window_" + self.window_align)
        if self.chunk is not None:
            f.add("chunk_" + self.window_align)
        if self.layout != "contiguous":
            f.add(self.layout)
        return f

    def summary(self) -> str:
        """One line: shapes, dtype, masks, scale, regime and seed."""
        s = self.shape
        gqa = f" Hkv={s['Hkv']}" if s["Hkv"] != s["Hq"] else ""
        extra = f" scale={self.scale:g}" if self.scale is not None else ""
        extra += f" dropout={self.dropout_p:g}" if self.dropout_p else ""
        extra += f" layout={self.layout}" if self.layout != "contiguous" else ""
        extra += f" softcap={self.softcap:g}" if self.softcap is not None else ""
        extra += f" alibi{list(self.alibi_slopes.shape)}@{self.window_align}" if self.alibi_slopes is not None else ""
        extra += " sinks" if self.sinks is not None else ""
        extra += "".join(f" {k}={v}" for k, v in sorted(self.packing.items()))
        return (f"B={s['B']} Hq={s['Hq']}{gqa} Lq={s['Lq']} Lk={s['Lk']} Dk={s['Dk']} Dv={s['Dv']} "
                f"{self.dtype} mask={self.mask_kind()}{extra} regime={self.regime} seed={self.seed}")

    def describe(self) -> dict[str, Any]:
        """JSON-ready parameters (no arrays) for records and reports."""
        d = dict(self.shape)
        d.update(dtype=self.dtype, mask=self.mask_kind(), causal=self.causal, scale=self.scale,
                 dropout_p=self.dropout_p, layout=self.layout, regime=self.regime, seed=self.seed,
                 window=list(self.window) if self.window else None, softcap=self.softcap,
                 alibi=self.alibi_slopes is not None, sinks=self.sinks is not None, packing=dict(self.packing))
        return d

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """How Hypothesis prints a case (each pinned example is printed before it runs, and a failing one
        in the report): its one-line summary. The dataclass default printed every array, field by field
        (3.2 of the 23 s of a profiled -x run of a buggy kernel caught by a pinned case, measured under load);
        the arrays themselves are in the .npz the run saves beside its run file."""
        printer.text(f"Case({self.summary()})")

    def digest(self) -> str:
        """A content hash: equal cases have equal digests."""
        h = hashlib.sha256()
        for name in _ARRAYS:
            arr = getattr(self, name)
            h.update(name.encode())
            if arr is not None:
                h.update(str(arr.shape).encode())
                h.update(np.ascontiguousarray(arr).tobytes())
        h.update(json.dumps(self._params(), sort_keys=True).encode())
        return h.hexdigest()[:16]

    def _params(self) -> dict[str, Any]:
        p = {"causal": self.causal, "scale": self.scale, "dtype": self.dtype, "dropout_p": self.dropout_p,
             "seed": self.seed, "layout": self.layout, "regime": self.regime}
        # written only when used, so cases saved before these fields existed keep their digests
        if self.window is not None:
            p["window"] = list(self.window)
        if self.chunk is not None:
            p["chunk"] = self.chunk
        if self.window is not None or self.alibi_slopes is not None or self.chunk is not None:
            p["window_align"] = self.window_align   # ALiBi distances use the same alignment (ATTN-ALIBI-1)
        if self.softcap is not None:
            p["softcap"] = self.softcap
        if self.packing:
            p["packing"] = dict(self.packing)
        return p

    def strides(self) -> dict[str, list[int]]:
        """The element strides of q, k and v as the case's layout lays them out (B, H, L, D order): what a
        kernel that reads memory by strides saw, beyond the layout's name. contiguous: row-major;
        noncontiguous: the (B, L, H, D) projection layout seen as (B, H, L, D); broadcast_kv: k and v with
        stride 0 over the batch."""
        out = {}
        for name in ("q", "k", "v"):
            B, H, L, D = getattr(self, name).shape
            if self.layout == "noncontiguous":
                out[name] = [L * H * D, D, H * D, 1]
            elif self.layout == "broadcast_kv" and name != "q":
                out[name] = [0, L * D, D, 1]
            else:
                out[name] = [H * L * D, L * D, D, 1]
        return out

    # ---- persistence (plain .npz, loadable without attnconf) -----------
    def save(self, path: str | Path) -> Path:
        """Write the case as .npz: arrays by name, a JSON `params` entry and, beside it, a JSON `strides`
        entry (the layout's strides, `strides()`; outside `params`, so a case's digest does not change)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {n: getattr(self, n) for n in _ARRAYS if getattr(self, n) is not None}
        np.savez(path, params=np.array(json.dumps(self._params())), strides=np.array(json.dumps(self.strides())),
                 **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Case":
        """Load a saved case (a layer case too: the file's params say which)."""
        with np.load(path, allow_pickle=False) as data:
            params = json.loads(str(data["params"]))
            kind = params.get("kind")
            if kind is not None:
                if kind not in LOADERS:
                    raise CaseError(f"{path}: unknown case kind {kind!r}; known: {', '.join(sorted(LOADERS))}")
                return LOADERS[kind](data, params)
            arrays = {n: data[n] for n in _ARRAYS if n in data.files}
        q, k, v = arrays.pop("q"), arrays.pop("k"), arrays.pop("v")
        return cls.build(q, k, v, **arrays, **params)
