"""How a Case is presented to transformers (`plan()`): in model mode through the library's own mask
functions, config and cache, or as a custom 4D mask; the reason, in one line, where neither can say it.
The modes and the window mapping are described in adapter.py's docstring; this module decides, adapter.py
calls."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from attnconf.reference import Case, visibility


@dataclass
class Plan:
    """How one Case is presented to transformers (see the module docstring)."""

    mode: Literal["model", "custom"]
    is_causal: bool = False              # module.is_causal and the causal mask functions
    sliding_window: int | None = None    # config.sliding_window for create_sliding_window_causal_mask
    bidirectional_window: int | None = None  # config.sliding_window for the bidirectional window mask
    past: int = 0                        # keys/values already in the DynamicCache (P = Lk - Lq)
    cross: bool = False                  # non-causal Lq != Lk: cross-attention over encoder_hidden_states
    padding: np.ndarray | None = None    # (B, Lk) bool, the 2D attention_mask (True = attend)
    custom: np.ndarray | None = None     # (B, 1 or Hq, Lq, Lk) bool: the custom 4D mask's visibility

    def describe(self) -> str:
        if self.mode == "custom":
            return "custom 4D mask"
        parts = []
        if self.sliding_window is not None:
            parts.append(f"create_sliding_window_causal_mask(sliding_window={self.sliding_window})")
        elif self.bidirectional_window is not None:
            parts.append(f"create_bidirectional_sliding_window_mask(sliding_window={self.bidirectional_window})")
        elif self.is_causal:
            parts.append("create_causal_mask")
        else:
            parts.append("create_bidirectional_mask" + (" (encoder_hidden_states)" if self.cross else ""))
        if self.past:
            parts.append(f"DynamicCache holding {self.past}")
        if self.padding is not None:
            parts.append("2D attention_mask")
        return ", ".join(parts)


def _window(case: Case) -> tuple[int, int] | None:
    """The case's window, None when absent or unbounded on both sides."""
    if case.window is None or tuple(case.window) == (-1, -1):
        return None
    return tuple(case.window)


def _key_padding(case: Case) -> np.ndarray | None | bool:
    """The case's boolean mask and kv_lengths as a 2D (B, Lk) padding mask; False if the mask is not key-only."""
    s = case.shape
    B, Lk = s["B"], s["Lk"]
    pad = None
    if case.mask is not None:
        full = np.broadcast_to(case.mask, (B, s["Hq"], s["Lq"], Lk))
        if not (full == full[:, :1, :1, :]).all():
            return False
        pad = full[:, 0, 0, :].copy()
    if case.kv_lengths is not None:
        keep = np.arange(Lk)[None, :] < case.kv_lengths[:, None]
        pad = keep if pad is None else pad & keep
    return pad


def plan(case: Case, *, bias_in_model_mode: bool) -> Plan | str:
    """The transformers presentation of `case`, or a one-line reason why transformers cannot express it.

    `bias_in_model_mode`: the implementation takes a bias next to the model's masks (sdpa and flex through
    `position_bias`); eager functions take a bias only inside a custom 4D mask.
    """
    s = case.shape
    Lq, Lk = s["Lq"], s["Lk"]
    P = Lk - Lq
    window = _window(case)
    if case.q_lengths is not None:
        return "transformers has no query padding (q_lengths)"
    why_not = _model_mode_problem(case, window, bias_in_model_mode)
    if why_not is None:
        pad = _key_padding(case)
        p = Plan(mode="model", padding=None if pad is None or pad.all() else pad)
        if window is None:
            p.is_causal = case.causal is not None
        else:
            left, right = window
            if case.causal is not None or right == 0:
                p.is_causal = True
                p.sliding_window = left + 1 if left >= 0 else None
            else:
                p.bidirectional_window = left
        if p.is_causal:
            p.past = P
        else:
            p.cross = Lq != Lk
        return p
    if window is not None:
        return f"transformers expresses this window only through its mask functions, and here: {why_not}"
    if case.mask is None and case.bias is None and case.causal is None and case.kv_lengths is None:
        return why_not  # pragma: no cover (model mode always takes an unmasked case)
    vis = visibility((s["B"], s["Hq"], Lq, Lk), mask=case.mask, causal=case.causal, kv_lengths=case.kv_lengths)
    if (vis == vis[:, :1]).all():
        vis = vis[:, :1]
    return Plan(mode="custom", custom=vis)


def _model_mode_problem(case: Case, window, bias_in_model_mode: bool) -> str | None:
    """Why the model's own mask functions cannot build this case's mask (None: they can)."""
    s = case.shape
    Lq, Lk = s["Lq"], s["Lk"]
    if case.bias is not None and not bias_in_model_mode:
        return "a bias reaches the eager functions only inside a custom 4D mask"
    if _key_padding(case) is False:
        return "the boolean mask varies over queries or heads (a 2D attention_mask is per key)"
    aligns = set()
    if case.causal is not None:
        aligns.add(case.causal)
    if window is not None:
        left, right = window
        causal_like = case.causal is not None or right == 0
        if causal_like and left < -1:
            return f"window {window} is not a transformers sliding window"  # pragma: no cover
        if not causal_like and not (left == right and left >= 0):
            return (f"window {window} is neither causal (w - 1, 0) (config.sliding_window = w) nor "
                    f"symmetric (w, w) (bidirectional sliding window)")
        if causal_like and left == -1 and right not in (-1, 0) and case.causal is None:
            return f"window {window} is not a transformers sliding window"  # pragma: no cover
        aligns.add(case.window_align)
        if not causal_like and Lq != Lk:
            return "a bidirectional sliding window is built for self-attention only (Lq == Lk)"
    if not aligns:
        return None
    if Lq > Lk:
        return "causal masking in transformers puts the Lq queries after Lk - Lq cached keys, so Lq <= Lk"
    if Lq < Lk and "top_left" in aligns:
        return "with a KV cache (Lq < Lk) transformers aligns causal masks and windows bottom-right"
    if (case.kv_lengths is not None and "bottom_right" in aligns and (case.kv_lengths != Lk).any()):
        return ("bottom-right alignment with per-batch kv_lengths: transformers aligns to the full key "
                "length (left padding), the spec to each kv_len")
    return None
