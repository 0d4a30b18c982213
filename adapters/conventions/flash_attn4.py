"""The `flash_attn4` convention: flash-attention 4's cute interface `flash_attn_func`.

    flash_attn_func(q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None, causal=False,
                    window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
                    deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None, aux_tensors=None,
                    aux_scalars=None, block_sparse_tensors=None, block_sparse_tensors_bwd=None, return_lse=False)

(Dao-AILab/flash-attention `flash_attn/cute/interface.py`, `flash_attn/cute/softmax.py`). The
convention binds q, k, v, softmax_scale, causal, window_size, learnable_sink, softcap, num_splits,
pack_gqa, deterministic and return_lse by keyword; the rest keep their defaults. What it says:

- layout (B, L, H, D) for q, k, v and the output, GQA by contiguous head groups, causal and windows
  aligned bottom-right with inclusive bounds, softcap before masking: as the `flash_attn` convention
  (flash_attn.py), except that an unbounded window side is None, not -1 (`_resolve_causal_local_window`:
  causal sets the right side to 0);
- it always returns a tuple (out, lse); lse is None unless `return_lse=True` (or an input requires
  grad), then (B, Hq, Lq) float32, natural log; a row that sees no key has lse = -inf;
- `learnable_sink` (Hq,) float16/bfloat16/float32 logits, one per query head, in natural units (not
  multiplied by softmax_scale): exp(sink) joins every row's denominator with no value
  (ATTN-SINK-1). **The returned lse includes the sink**: `softmax.py` `finalize` adds
  exp2(sink * log2 e - row_max) to the row sum before taking the log, and a row that sees no key gets
  lse = sink (`interface.py` fills lse with learnable_sink when seqlen_k = 0). That is the spec's lse
  (reference/lse.py `add_sink`), so it is judged as is (ATTN-SINK-5). The sink is passed as float32.

Outside the convention: masks (`mask_mod` and block sparsity are another interface), bias, padding,
dropout, ALiBi, score_mod, top-left causal or window with Lq != Lk.
"""
from __future__ import annotations

import numpy as np
import torch

from attnconf.reference import Case
from attnconf.spec.vocabulary import HALF_DTYPES

from ..base import ConventionViolation, Result
from .common import Convention, ConventionAdapter, lse_to_spec
from .flash_attn import bhld_to_blhd

KEYWORDS = ("q", "k", "v", "softmax_scale", "causal", "window_size", "learnable_sink", "softcap", "num_splits",
            "pack_gqa", "deterministic", "return_lse")
FEATURES = frozenset({"causal_bottom_right", "window_bottom_right", "softcap", "sinks", "gqa", "custom_scale",
                      "cross", "dv_ne_dk", "lse", "grads", "noncontiguous", "broadcast_kv"})
OUTSIDE = ("boolean masks (mask_mod)", "additive bias (score_mod)", "query/key padding", "dropout", "ALiBi",
           "top-left causal or window with Lq != Lk", "block sparsity")


def pair(ad: ConventionAdapter, ret, return_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out, lse) from the tuple the cute interface always returns (a bare output is taken as (out, None) when
    no lse was asked for: a wrapper that drops the None)."""
    if isinstance(ret, torch.Tensor) and not return_lse:
        return ret, None
    if not isinstance(ret, (tuple, list)) or len(ret) != 2:
        raise ConventionViolation("ATTN-OP-2", f"kernel returned {type(ret).__name__}; the flash_attn4 convention "
                                  "returns the tuple (out, lse)")
    if return_lse and ret[1] is None:
        raise ConventionViolation("ATTN-LSE-1", "kernel returned lse None with return_lse=True")
    return ret[0], ret[1]


class FlashAttn4(Convention):
    def run(self, ad: ConventionAdapter, case: Case, *, grads: bool, want_lse: bool) -> Result:
        s = case.shape
        B, Hq, Lq, Dv = s["B"], s["Hq"], s["Lq"], s["Dv"]
        leaves: dict[str, torch.Tensor] = {}
        q, k, v = (bhld_to_blhd(ad, getattr(case, n), case, grads=grads, kv=n != "q", leaves=leaves, name=f"d{n}")
                   for n in ("q", "k", "v"))
        window = (None, None) if case.window is None else tuple(None if w < 0 else int(w) for w in case.window)
        sink = None if case.sinks is None else ad.tensor(case.sinks, "float32")
        kwargs = dict(q=q, k=k, v=v, softmax_scale=None if case.scale is None else float(case.scale),
                      causal=case.causal is not None, window_size=window, learnable_sink=sink,
                      softcap=0.0 if case.softcap is None else float(case.softcap), num_splits=1, pack_gqa=None,
                      deterministic=False, return_lse=want_lse)
        out_t, lse_t = pair(ad, ad.invoke(kwargs, None), want_lse)
        out = ad.array(out_t, (B, Lq, Hq, Dv), "output").transpose(0, 2, 1, 3)
        res = Result(out=np.ascontiguousarray(out), out_dtype=ad.out_dtype(out_t), kernel=ad.name)
        if grads:
            go = ad.tensor(case.grad_out, case.dtype).transpose(1, 2)
            res.grads = ad.backward(out_t, leaves, go)
        if want_lse:
            lse = ad.array(lse_t, (B, Hq, Lq), "lse (B, H, Lq)")
            res.lse = lse_to_spec(lse, case, empty=-np.inf, base2=False, name=self.name,
                                  where=lambda i: f"batch {i[0]}, head {i[1]}, query {i[2]}")
        return res

    def run_raw(self, ad, q, k, v, dtype):
        t = [ad.tensor(x, dtype).transpose(1, 2).contiguous() for x in (q, k, v)]
        ret = ad.fn(q=t[0], k=t[1], v=t[2])
        return (ret[0] if isinstance(ret, (tuple, list)) else ret).detach().cpu().float().numpy()


CONVENTION = FlashAttn4(
    name="flash_attn4", entry="flash_attn.cute.flash_attn_func", keywords=KEYWORDS, features=FEATURES,
    default=FEATURES - {"dv_ne_dk"}, outside=OUTSIDE, dtypes=HALF_DTYPES, max_head_dim=256)
