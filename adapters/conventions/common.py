"""What the calling conventions share: their description and the adapter that calls a kernel in one.

A `Convention` says what it can express (`features`, in the vocabulary of
`adapters.base.CAPABILITIES`), what an undeclared kernel is certified for
(`default`), the keywords it binds, and, in words, what lies outside it. Its
`run(adapter, case, grads, want_lse)` builds the call, makes it, and converts the
result into a `Result` in the spec's layout.

`ConventionAdapter` is the adapter around a third-party kernel in a convention.
It decides support in three steps, each with its own reason: outside the
convention ("outside the flash_attn convention: mask"), outside the kernel's
declared scope ("... does not declare softcap"), then dtype and limits. The
kernel is untrusted: a `NotImplementedError` it raises makes the case unsupported
(`NotSupported`), any other exception is a `KernelError`, a mutated input or a
result that breaks the convention's own contract (its output shape, its empty-row
lse value, where appended keys land) is a `ConventionViolation` naming the clause.

Upstream facts the conventions rely on are cited where they are used; the
flash-attention ones from Dao-AILab/flash-attention `flash_attn/flash_attn_interface.py`
(docstrings of `flash_attn_func`, `flash_attn_varlen_func`, `flash_attn_with_kvcache`),
`csrc/flash_attn/src/mask.h` (window bounds and ALiBi), `csrc/flash_attn/src/softmax.h`
(`normalize_softmax_lse`: lse = +inf for a row with zero sum) and
`csrc/flash_attn/flash_api.cpp` (softcap folded into the scale, causal sets the right window to 0).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import numpy as np
import torch

from attnconf.reference import Case
from attnconf.spec.vocabulary import DTYPES

from ..base import Adapter, ConventionViolation, KernelError, NotSupported, Result
from ..contract import is_refusal
from attnconf.adapters.scope import Scope
from attnconf.adapters.torch.convert import device_info, dtype_name, limit_threads, to_numpy, to_tensor


# ---- alignment ---------------------------------------------------------------------------
def lengths(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """Per batch element: (query length, key length) after padding."""
    s = case.shape
    ql = np.full(s["B"], s["Lq"]) if case.q_lengths is None else case.q_lengths.astype(int)
    kl = np.full(s["B"], s["Lk"]) if case.kv_lengths is None else case.kv_lengths.astype(int)
    return ql, kl


def alignments_coincide(case: Case) -> bool:
    """True when top-left and bottom-right alignment are the same visibility for this case:
    every batch element that has query rows has as many keys as queries (offset kv_len - q_len = 0)."""
    ql, kl = lengths(case)
    return bool(np.all((ql == kl) | (ql == 0)))


def bottom_right_requirements(case: Case) -> set[str]:
    """Case.features() with top-left causal / window renamed bottom-right where the two coincide
    (the flash-attention and FlashInfer conventions align bottom-right and say nothing else)."""
    f = set(case.features())
    if alignments_coincide(case):
        for kind in ("causal", "window", "chunk"):
            if f"{kind}_top_left" in f:
                f.discard(f"{kind}_top_left")
                f.add(f"{kind}_bottom_right")
        if "alibi_top_left" in f:
            f.discard("alibi_top_left")
            f.add("alibi")
    return f


def alibi_alignment_ok(case: Case) -> Literal[True] | str:
    if case.alibi_slopes is None:
        return True
    if case.window_align == "top_left" and not alignments_coincide(case):
        return "ALiBi distances aligned top-left with Lq != Lk (the convention measures |i + Lk - Lq - j|)"
    slopes = np.asarray(case.alibi_slopes, dtype=np.float64)
    if not np.array_equal(slopes.astype(np.float32).astype(np.float64), slopes):
        return "ALiBi slopes that float32 cannot hold (the convention's alibi_slopes are float32)"
    return True


# ---- the description ---------------------------------------------------------------------
@dataclass
class Convention:
    """One calling convention: what it expresses and how a Case becomes a call."""

    name: str
    entry: str                                   # the upstream function it mirrors
    keywords: tuple[str, ...]                    # every keyword the adapter binds
    features: frozenset[str]                     # all it can express (grads and dropout included)
    default: frozenset[str]                      # an undeclared kernel's scope
    outside: tuple[str, ...]                     # what lies outside it, in words
    dtypes: tuple[str, ...] = DTYPES
    max_head_dim: int | None = None
    notes: dict[str, str] = field(default_factory=dict)
    writes: tuple[str, ...] = ()      # arguments the convention lets the kernel write (a KV cache's appends)
    # the accuracy contract an undeclared kernel is held to (conformance/engine/alternatives_contracts.py); None = exact
    accuracy_contract: dict[str, Any] | None = None

    def requirements(self, case: Case) -> set[str]:
        return bottom_right_requirements(case)

    def expressible(self, case: Case) -> Literal[True] | str:
        """True, or what about this case the convention cannot say (beyond the feature names)."""
        return alibi_alignment_ok(case)

    def run(self, adapter: "ConventionAdapter", case: Case, *, grads: bool, want_lse: bool) -> Result:
        raise NotImplementedError

    def plain_packing(self, case: Case, adapter: "ConventionAdapter") -> dict | None:
        """case.packing pinned to the plainest representation the kernel takes (None: one representation only)."""
        return None

    def representation_words(self, case: Case, adapter: "ConventionAdapter") -> str:
        """How the case reaches the kernel, in words, where the convention has several ways ("" otherwise)."""
        return ""

    def run_raw(self, adapter: "ConventionAdapter", q, k, v, dtype: str):
        raise NotImplementedError(f"the {self.name} convention cannot pass raw (B, H, L, D) shapes")

    def check_signature(self, fn: Callable[..., Any]) -> str | None:
        """None if `fn` accepts every keyword this convention binds, else a one-line reason."""
        if not callable(fn):
            return f"{fn!r} is not callable"
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            return None
        try:
            sig.bind(**{k: None for k in self.keywords})
        except TypeError as exc:
            params = [p.name for p in sig.parameters.values()]
            missing = [k for k in self.keywords if k not in params]
            if missing and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
                return (f"signature {sig} does not take the {self.name} convention's keyword(s) "
                        f"{', '.join(missing)} ({self.entry})")
            return f"signature {sig} does not bind the {self.name} convention ({self.entry}) by keyword: {exc}"
        return None


# ---- the adapter ---------------------------------------------------------------------------
class ConventionAdapter(Adapter):
    """A third-party torch kernel called in one of the conventions (see the module docstring)."""

    trusted = False
    backend = "torch"
    lse_dtypes = ("float32", "float16", "bfloat16")   # every convention returns its lse in float32

    def lse_refusal(self, dtype: str) -> str | None:
        if dtype in self.lse_dtypes:
            return None
        return (f"outside the {self.conv.name} convention: its lse is float32, so a {dtype} case's lse "
                f"cannot be judged at {dtype} precision")

    def __init__(self, fn: Callable[..., Any], conv: Convention, device: str, name: str):
        super().__init__(device)
        self.fn, self.conv, self.name = fn, conv, name
        self.convention = conv.name
        self.dtypes = conv.dtypes
        self.capabilities = conv.default
        self.expressible, self.outside_convention = conv.features, tuple(conv.outside)
        self.max_head_dim = conv.max_head_dim
        self.scope_source = f"full {conv.name} convention (no declaration)"
        self.accuracy_contract = conv.accuracy_contract
        limit_threads()

    # -- scope --------------------------------------------------------------------------
    def requirements(self, case: Case) -> set[str]:  # type: ignore[override]
        return self.conv.requirements(case)

    def supports(self, case: Case, *, need: frozenset[str] = frozenset()) -> Literal[True] | str:
        reqs = self.requirements(case) | set(need)
        outside = sorted(reqs - self.conv.features)
        if outside:
            return f"outside the {self.conv.name} convention: {', '.join(outside)}"
        if "lse" in need and (refusal := self.lse_refusal(case.dtype)):
            return refusal
        reason = self.conv.expressible(case)
        if reason is not True:
            return f"outside the {self.conv.name} convention: {reason}"
        reason = Scope.of(self).fit(case, need, requirements=reqs)   # the declared scope
        return reason if reason is not True else self.extra_support(case)

    def scope(self) -> dict[str, Any]:
        return {**super().scope(), "entry_point": self.conv.entry}

    # -- running ------------------------------------------------------------------------
    def run(self, case: Case, *, grads: bool = False) -> Result:
        if grads and case.grad_out is None:
            raise ValueError("grads=True needs case.grad_out")
        want_lse = "lse" in self.capabilities and case.dtype != "float64"   # the conventions' lse is float32
        return self.conv.run(self, case, grads=grads, want_lse=want_lse)

    def run_raw(self, q, k, v, dtype):
        return self.conv.run_raw(self, q, k, v, dtype)

    def describe(self) -> dict[str, Any]:
        fn = self.fn
        return {**device_info(self.device), **super().describe(),
                "kernel": f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}",
                "calling_convention": self.conv.name, "entry_point": self.conv.entry, "scope": self.scope()}

    # -- helpers the convention modules use -------------------------------------------------
    def tensor(self, x: np.ndarray, dtype: str, *, grads: bool = False) -> torch.Tensor:
        return to_tensor(x, dtype, self.device).requires_grad_(grads)

    def invoke(self, kwargs: dict[str, Any], seed: int | None) -> Any:
        """fn(**kwargs) with the RNG seeded; every tensor argument the convention does not let the kernel
        write (`Convention.writes`) must come back unchanged (ATTN-OP-8)."""
        watch = {n: t for n, t in kwargs.items() if n not in self.conv.writes}
        before = {n: t.detach().clone() for n, t in watch.items() if isinstance(t, torch.Tensor)}
        if seed is not None:
            torch.manual_seed(seed)
        try:
            ret = self.fn(**kwargs)
        except Exception as exc:  # the kernel's own failure, reported per test, unless it means "not supported"
            if is_refusal(self, exc):
                raise NotSupported(f"{self.name} raised {type(exc).__name__}: {first_line(exc)}") from None
            raise KernelError(f"kernel raised {type(exc).__name__}: {first_line(exc)}") from exc
        for n, t in before.items():
            after = watch[n].detach()       # NaN must stay NaN (unread padding, ATTN-MEM-1), and stay where it was
            if t.is_floating_point() and t.element_size() == 1:      # FP8: isnan and == have no kernel for it
                t, after = t.float(), after.float()
            if t.shape != after.shape or not bool(((t == after) | (torch.isnan(t) & torch.isnan(after))).all()):
                raise ConventionViolation("ATTN-OP-8", f"kernel mutated its input `{n}` in place")
        return ret

    def unpack(self, ret: Any, extra: bool, what: str) -> tuple[torch.Tensor, Any]:
        """(out, lse) from a return value: a tensor without the extra flag, a tuple (out, lse, ...) with it."""
        if not extra:
            if isinstance(ret, (tuple, list)):
                raise ConventionViolation("ATTN-OP-2", f"kernel returned a {type(ret).__name__} with {what}=False; "
                                          f"the {self.conv.name} convention returns the output tensor alone")
            return ret, None
        if not isinstance(ret, (tuple, list)) or len(ret) < 2:
            raise ConventionViolation("ATTN-LSE-1", f"kernel returned {type(ret).__name__} with {what}=True; the "
                                      f"{self.conv.name} convention returns a tuple (out, lse, ...)")
        return ret[0], ret[1]

    def array(self, t: Any, shape: tuple[int, ...], what: str, *, floating: bool = True) -> np.ndarray:
        """A float64 NumPy copy of a returned tensor, which must have the convention's shape."""
        if not isinstance(t, torch.Tensor):
            raise KernelError(f"kernel returned {type(t).__name__} as {what}, not a tensor")
        if floating and not t.is_floating_point():
            raise KernelError(f"kernel returned {what} as {t.dtype}, not floating point")
        if tuple(t.shape) != tuple(shape):
            clause = "ATTN-LSE-1" if what.startswith("lse") else "ATTN-OP-2"
            raise ConventionViolation(clause, f"{what} has shape {tuple(t.shape)}; the {self.conv.name} "
                                      f"convention says {tuple(shape)}")
        if what.startswith("lse") and t.dtype != torch.float32:   # what split-KV and context-parallel merges read
            raise ConventionViolation("ATTN-LSE-1", f"{what} is {dtype_name(t)}; the {self.conv.name} convention "
                                      "returns the lse in float32")
        return to_numpy(t)

    def out_dtype(self, t: torch.Tensor) -> str:
        return dtype_name(t)

    def backward(self, out: torch.Tensor, leaves: dict[str, torch.Tensor], grad_out: torch.Tensor) -> dict[str, np.ndarray]:
        """dq, dk, dv of sum(grad_out * out) through the kernel's autograd graph."""
        if not out.requires_grad:
            if bool((out == 0).all()):   # an output that is identically 0 (no row sees a key) may carry no graph
                return {n: np.zeros(tuple(t.shape)) for n, t in leaves.items()}
            raise KernelError("kernel output has no autograd graph (a forward-only kernel: declare \"grads\": false)")
        try:
            gs = torch.autograd.grad(out, list(leaves.values()), grad_out, allow_unused=True)
        except Exception as exc:
            if is_refusal(self, exc):
                raise NotSupported(f"{self.name} backward raised {type(exc).__name__}: {first_line(exc)}") from None
            raise KernelError(f"kernel backward raised {type(exc).__name__}: {first_line(exc)}") from exc
        missing = [n for n, g in zip(leaves, gs) if g is None]
        if missing:
            raise KernelError(f"kernel backward returned no gradient for {', '.join(missing)}")
        return {n: to_numpy(g) for n, g in zip(leaves, gs)}


def first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0][:300] if text else ""


def inputs_finite(case: Case) -> bool:
    return bool(np.isfinite(case.q).all() and np.isfinite(case.k).all() and np.isfinite(case.v).all())


def lse_to_spec(lse: np.ndarray, case: Case, *, empty: float, base2: bool, name: str, where: Callable[[tuple], str]
                ) -> np.ndarray:
    """The convention's lse in the spec's terms: natural log, -inf for a row that sees no key.

    `empty` is the convention's value for such a row (+inf for flash-attention, -inf for FlashInfer);
    any other infinity, or NaN from finite inputs, breaks the convention (ATTN-LSE-2)."""
    out = np.array(lse, dtype=np.float64)
    if base2:
        out = out * np.log(2.0)
    sentinel = np.isinf(lse) & (np.sign(lse) == np.sign(empty))
    bad = np.isinf(lse) & ~sentinel
    if inputs_finite(case):
        bad |= np.isnan(lse)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ConventionViolation("ATTN-LSE-2", f"lse is {lse[idx]} at {where(idx)}; the {name} convention gives a "
                                  f"finite lse, or {empty} for a row that sees no key ({int(bad.sum())} such value(s))")
    out[sentinel] = -np.inf
    return out


def torch_dtype_of_slopes(case: Case) -> str:
    """ALiBi slopes are float32 in the flash-attention convention (`alibi_slopes: ..., fp32`), for every
    dtype: a case whose slopes float32 cannot hold exactly is outside it (`alibi_alignment_ok`)."""
    return "float32"


# ---- memory the kernel must not read (ATTN-MEM-1) ------------------------------------------------
TAIL_ROWS = 16     # rows of poison after a K/V tensor's last row (one-past-the-end reads land in them)


def unread(finite: np.ndarray, dtype: str) -> np.ndarray:
    """What a buffer position the kernel must not read holds: NaN in every float dtype (a read times a
    zero weight, 0 x NaN, then shows in the output), else `finite`, values unlike the case's that change
    the result if read (for a dtype that cannot store NaN, such as int8 or an fp8 without NaN)."""
    from attnconf.reference import DTYPES

    return np.full(np.shape(finite), np.nan) if dtype in DTYPES else finite


def poisoned_tail(t: torch.Tensor, rows: int = TAIL_ROWS) -> torch.Tensor:
    """`t` as the start of a larger buffer whose next `rows` x (t's last two dims) elements hold NaN: the
    tensor the kernel gets is unchanged (shape, strides, contiguity), but a read past its end is NaN.
    A non-contiguous or non-float tensor is returned as it is."""
    if not t.is_contiguous() or not t.is_floating_point() or t.dim() < 2:
        return t
    extra = rows * t.shape[-1] * t.shape[-2]
    flat = torch.full((t.numel() + extra,), float("nan"), dtype=t.dtype, device=t.device)
    flat[: t.numel()] = t.reshape(-1)
    return flat[: t.numel()].view(t.shape)
