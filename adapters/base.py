"""The one small interface every backend implements.

An adapter receives a `reference.Case` (float64 NumPy inputs already rounded to
the dtype under test) and returns NumPy arrays in a `Result`. It declares what
it can do once, in `capabilities`, and `supports(case)` derives from that
declaration either True or the reason it cannot run the case: an unsupported
case is reported as unsupported, never as passed.
"""
from __future__ import annotations

from abc import ABCMeta
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from attnconf.reference import Case

if TYPE_CHECKING:
    from attnconf.reference.layer import LayerCase

from attnconf.spec.vocabulary import CAPABILITIES, DTYPES  # noqa: E402  (CAPABILITIES re-exported: adapters name it here)

from .scope import Scope  # noqa: E402


class KernelError(Exception):
    """The kernel under test raised or returned something unusable (not a suite bug)."""


class ConventionViolation(KernelError):
    """The kernel broke its calling convention's own contract: the output shape it promises, the value it
    gives a row that sees no key, where appended keys land in a cache. The message starts with `[clause]`."""

    def __init__(self, clause: str, message: str):
        super().__init__(f"[{clause}] {message}")
        self.clause = clause


@dataclass
class Result:
    """What an adapter returns. Arrays are float64 copies of the kernel's values."""

    out: np.ndarray
    out_dtype: str                                  # dtype name the kernel returned
    lse: np.ndarray | None = None
    weights: np.ndarray | None = None
    grads: dict[str, np.ndarray] | None = None      # keys among dq, dk, dv, dbias
    # the output of a second call that returned the lse (flash-attention's return_attn_probs=True),
    # judged like `out`: a kernel whose statistics path computes another output is caught
    out_with_lse: np.ndarray | None = None
    kernel: str = ""                                # what actually ran
    notes: dict[str, Any] = field(default_factory=dict)


# The example budget of an implementation that compiles every new shape (JAX, Keras under XLA, equinox,
# flax: 0.1 to 0.25 s an example on a 2-core CPU against about 0.02 s eager, measured in the ci runs):
# a third of the examples, and its cells share each clause's coverage floor (conformance.harness.cell_minimum).
COMPILES_PER_SHAPE = 0.35


class Implementation:
    """What every implementation declares: its identity, devices, dtypes and capabilities.

    Two protocols build on it: `Adapter` (one attention call on a `Case`) and `LayerAdapter` (a
    multi-head attention layer on a `LayerCase`). `kind` tells them apart ("sdpa" / "layer").
    """

    backend: str = ""                   # family, e.g. "torch"
    name: str = ""                      # implementation, e.g. "torch:sdpa-math"
    kind: str = ""                      # "sdpa" (Adapter) or "layer" (LayerAdapter)
    devices: tuple[str, ...] = ("cpu",)
    dtypes: tuple[str, ...] = DTYPES
    capabilities: frozenset[str] = frozenset()
    head_dims: tuple[int, ...] | None = None   # the only head dims it runs (a declared scope's list)
    max_seqlen: int | None = None       # longest Lq or Lk it runs
    convention: str = ""                # how a --kernel is called ("sdpa", "flash_attn", ...); "" for built-ins
    expressible: frozenset[str] | None = None   # all its convention can express (None: every capability)
    outside_convention: tuple[str, ...] = ()    # what lies outside its convention, in words
    scope_source: str = "built-in"      # where the scope came from: "built-in", "full convention", an attribute, a file
    trusted: bool = True                # False for third-party kernels
    deterministic: bool = True          # False: declared nondeterministic (ATTN-DET-1 records its reruns' spread)
    example_budget: float = 1.0         # fraction of Hypothesis examples (COMPILES_PER_SHAPE: each new shape compiles)
    lse_dtypes: tuple[str, ...] = DTYPES   # whose lse can be judged
    # features every case it runs must carry (a function that always reads sinks); only those the
    # strategies report offering can be required (conformance/strategies/cells.py REQUIRABLE)
    requires: frozenset[str] = frozenset()
    contract = None                     # adapters/contract.py: documented behaviour and limits, if declared
    # the case's dropout seed reaches the kernel (torch's global generator, seeded per call), so a dropout
    # case reruns with the same mask (ATTN-DET-1); a convention with no seed channel sets False
    seeds_dropout = True

    def lse_refusal(self, dtype: str) -> str | None:
        """Why a `dtype` case's lse cannot be judged here (None if it can): one fact, used by `supports` and by
        the suite to mark an lse cell unsupported without drawing a case."""
        return None if dtype in self.lse_dtypes else f"{self.name} returns no lse that can be judged in {dtype}"

    def cell_refusal(self, needs: tuple[str, ...], dtype: str | None) -> str | None:
        """Why every case of a cell is refused, known before drawing one: the cell's property needs each of
        `needs` ("a|b" = either) in `dtype`. None if the cell draws (the default)."""
        return None

    def __init__(self, device: str = "cpu"):
        self.device = device

    def describe(self) -> dict[str, Any]:
        """Framework, version, device, and the kernel that runs."""
        return {"backend": self.backend, "implementation": self.name, "device": self.device}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} on {self.device}>"


class Adapter(Implementation, metaclass=ABCMeta):
    """The attention protocol: subclasses set the class attributes and implement `run`."""

    kind = "sdpa"
    max_head_dim: int | None = None

    # -- capability checks, derived from the declaration above ------------
    def supports(self, case: Case, *, need: frozenset[str] = frozenset()) -> Literal[True] | str:
        """True, or a one-line reason why this implementation cannot run `case`: outside its declared scope
        (`Scope.fit`), an lse it cannot judge, or what `extra_support` says."""
        needed = self.requirements(case)
        reason = Scope.of(self).fit(case, need, requirements=needed)
        if reason is True and "lse" in need and (refusal := self.lse_refusal(case.dtype)):
            return refusal
        reason = reason if reason is not True else self.extra_support(case)
        if reason is True and self.requires - needed:
            # last, so that a case refused for another reason too is shown with that one: fitting adds
            # what is required (scope_fit.fit), not what else is wrong
            lacking = ", ".join(sorted(self.requires - needed))
            return f"{self.name} runs only cases with {lacking}; this case has no {lacking}"
        return reason

    def limits_support(self, case: Case, need: frozenset[str] = frozenset()) -> Literal[True] | str:
        """The declared limits (`Scope.within_limits`): head dims, the longest sequence, the contract's."""
        return Scope.of(self).within_limits(case, need)

    def extra_support(self, case: Case) -> Literal[True] | str:
        """Hook for constraints the capability vocabulary cannot say."""
        return True

    @staticmethod
    def requirements(case: Case) -> set[str]:
        """The capabilities a case needs (the features it exercises)."""
        return case.features()

    # -- running ----------------------------------------------------------
    def run(self, case: Case, *, grads: bool = False) -> Result:
        """Run the kernel on `case`; with grads=True also back-propagate case.grad_out."""
        raise NotImplementedError

    def run_raw(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, dtype: str) -> np.ndarray:
        """Call the kernel on arbitrary, possibly invalid, shapes (ATTN-OP-6). Should raise on invalid input."""
        raise NotImplementedError

    def scope(self) -> dict[str, Any]:
        """The scope this implementation is certified in, in the words of a declaration (adapters/scope.py):
        dtypes, grads, dropout, features, limits, plus where it came from and what lies outside it."""
        return Scope.of(self).as_dict()

class LayerAdapter(Implementation):
    """The layer protocol (ATTN-MHA-1): a multi-head attention layer loaded with a LayerCase's weights.

    `supports_layer` derives from the declaration (the LayerCase's `features()` against
    `capabilities`, its dtype against `dtypes`) plus `extra_layer_support` for what the vocabulary
    cannot say; `run_layer` returns the layer's output as float64 NumPy (B, Lq, E). A layer adapter
    has no `run`: the suite never hands it a `Case`.
    """

    kind = "layer"

    def supports_layer(self, lc: LayerCase) -> Literal[True] | str:
        """True, or a one-line reason why this layer cannot run `lc` (`Scope.fit`, then `extra_layer_support`)."""
        reason = Scope.of(self).fit(lc, requirements=self.layer_requirements(lc))
        return reason if reason is not True else self.extra_layer_support(lc)

    def extra_layer_support(self, lc: LayerCase) -> Literal[True] | str:
        """Hook for constraints the capability vocabulary cannot say."""
        return True

    @staticmethod
    def layer_requirements(lc: LayerCase) -> set[str]:
        return lc.features()

    def run_layer(self, lc: LayerCase) -> np.ndarray:
        """The layer's output for `lc` as float64 NumPy; raise KernelError if the framework raised."""
        raise NotImplementedError



class NotSupported(Exception):
    """Raised by `run` when a forced path turns out not to run this case: recorded as unsupported, never as a pass."""
