"""The `equinox` backend: `equinox.nn.MultiheadAttention` and the per-head function it calls.

Implementations:
- `equinox:mha`: `equinox.nn.MultiheadAttention`, a layer adapter (ATTN-MHA-1), vmapped over the batch
  (the layer is unbatched: query (q_seq, q_size), key/value (kv_seq, size)), `inference=True`.
- `equinox:dpa`: `equinox.nn._attention.dot_product_attention`, the per-head function
  `MultiheadAttention.__call__` vmaps over heads. It is not exported from `equinox.nn` (the module
  is private), but it is exactly the attention the layer runs, so certifying it as an SDPA
  implementation covers what the layer test cannot: gradients, every dtype, masks and dropout
  per element. It is vmapped over batch and heads here, as the layer vmaps it over heads.

The per-head convention, read from equinox/nn/_attention.py (equinox 0.13.8):
- query (q_seq, qk_size), key (kv_seq, qk_size), value (kv_seq, v_size); one head, no batch.
- No scale argument: `query / math.sqrt(qk_size)` in the input dtype; custom scales are driven
  through Q (adapters/prescaled.py).
- `mask` (q_seq, kv_seq) bool, True = attend; anything else raises ValueError. A masked logit is
  replaced by `jnp.finfo(dtype).min` (finite), so a fully-masked row gets uniform weights: the mean
  of V. No bias, no causal flag, no lengths: causal masking and padding are folded into the one
  mask with the reference's visibility (as adapters/sdpa_convention.py does for SDPA).
- The softmax runs in `result_type(dtype, float32)`: float32 for half precision, float64 for float64.
- Dropout: an `equinox.nn.Dropout(p)` on the weights, `inference=False`, one PRNG key per (batch, head).
- No GQA: the layer projects keys and values to `num_heads` heads like queries.

JAX itself is imported through `attnconf.adapters.jax` (conversions, device lookup, x64 when the adapters are created,
matmul-precision policy).
"""
from __future__ import annotations

import functools
from typing import Any, Literal

import numpy as np

import jax

import equinox as eqx
from equinox.nn import _attention as eqx_attention

from attnconf.reference import Case, visibility
from attnconf.spec.vocabulary import DTYPES

from attnconf.adapters.base import COMPILES_PER_SHAPE, Adapter, KernelError, Result
from attnconf.adapters.jax.common import enable_x64
from attnconf.adapters.jax.adapter import jax_device, precision_context, to_jax, to_numpy
from attnconf.adapters.equinox.layer import EqxMhaAdapter, first_line, framework_versions
from attnconf.adapters.prescaled import scale_note, scale_reason, scaled_query

FRAMEWORK = "equinox"
INSTALL_HINT = "pip install 'jax[cpu]' equinox"
DEVICES = ("cpu", "gpu")

_DPA_CAPS = frozenset({"mask", "causal_top_left", "causal_bottom_right", "q_lengths", "kv_lengths", "custom_scale",
                       "dv_ne_dk", "cross", "mask_with_causal", "grads", "dropout"})


def folded_mask(case: Case) -> np.ndarray | None:
    """(B, Hq, Lq, Lk) bool: the case's mask, causal alignment and padding as one mask (None if none)."""
    if case.mask is None and case.causal is None and case.q_lengths is None and case.kv_lengths is None:
        return None
    s = case.shape
    return visibility((s["B"], s["Hq"], s["Lq"], s["Lk"]), mask=case.mask, causal=case.causal,
                      q_lengths=case.q_lengths, kv_lengths=case.kv_lengths)


def _per_head(q, k, v, mask, key, *, dropout_p):
    """One head, exactly as MultiheadAttention calls it (partial(dot_product_attention, dropout=...))."""
    dropout = eqx.nn.Dropout(dropout_p) if dropout_p > 0 else None
    return eqx_attention.dot_product_attention(q, k, v, mask=mask, dropout=dropout, key=key,
                                               inference=False if dropout_p > 0 else None)


def _attend(q, k, v, mask, keys, *, dropout_p):
    """(B, H, L, D) arrays; vmapped over batch and heads. `keys`: (B, H) PRNG keys or None."""
    fn = functools.partial(_per_head, dropout_p=dropout_p)
    axes = (0, 0, 0, None if mask is None else 0, None if keys is None else 0)
    return jax.vmap(jax.vmap(fn, in_axes=axes), in_axes=axes)(q, k, v, mask, keys)


def _attend_vjp(q, k, v, mask, keys, d_out, *, dropout_p):
    out, pull = jax.vjp(lambda q, k, v: _attend(q, k, v, mask, keys, dropout_p=dropout_p), q, k, v)
    return out, pull(d_out)


_attend_jit = jax.jit(_attend, static_argnames=("dropout_p",))
_attend_vjp_jit = jax.jit(_attend_vjp, static_argnames=("dropout_p",))


class EqxDpaAdapter(Adapter):
    """`equinox.nn._attention.dot_product_attention`, vmapped over batch and heads."""

    backend = "equinox"
    name = "equinox:dpa"
    example_budget = COMPILES_PER_SHAPE   # under jax.jit every new shape compiles (0.16-0.2 s an example)
    devices = ("cpu", "gpu")
    dtypes = DTYPES
    capabilities = _DPA_CAPS

    def __init__(self, device: str = "cpu", options: dict[str, Any] | None = None):
        enable_x64()      # float64 needs it; set when an adapter is made, never at import
        super().__init__("gpu" if device == "cuda" else device)
        self.options = dict(options or {})

    def extra_support(self, case: Case) -> Literal[True] | str:
        return scale_reason(case, self.name)

    def arguments(self, case: Case) -> tuple[tuple, float]:
        dev, t = jax_device(self.device), case.dtype
        q, c = scaled_query(case)
        mask = folded_mask(case)
        keys = None
        if case.dropout_p > 0:
            s = case.shape
            keys = jax.random.split(jax.random.key(int(case.seed) % 2**32), (s["B"], s["Hq"]))
        return (to_jax(q, t, dev), to_jax(case.k, t, dev), to_jax(case.v, t, dev),
                None if mask is None else to_jax(mask, "bool", dev), keys), c

    def run(self, case: Case, *, grads: bool = False) -> Result:
        args, c = self.arguments(case)
        p = float(case.dropout_p)
        try:
            with precision_context(self.options, case.dtype):
                if grads:
                    if case.grad_out is None:
                        raise KernelError("grads requested but the case has no grad_out")
                    d_out = to_jax(case.grad_out, case.dtype, jax_device(self.device))
                    out, (dq, dk, dv) = _attend_vjp_jit(*args, d_out, dropout_p=p)
                else:
                    out = _attend_jit(*args, dropout_p=p)
        except KernelError:
            raise
        except Exception as exc:
            raise KernelError(f"{self.name} raised {first_line(exc)}") from exc
        res = Result(out=to_numpy(out).astype(np.float64), out_dtype=str(out.dtype),
                     kernel="equinox.nn._attention.dot_product_attention, vmapped over (batch, heads), under jax.jit",
                     notes=scale_note(case))
        if grads:
            res.grads = {"dq": to_numpy(dq).astype(np.float64) * c, "dk": to_numpy(dk).astype(np.float64),
                         "dv": to_numpy(dv).astype(np.float64)}
        return res

    def run_raw(self, q, k, v, dtype):
        """The per-head function on (B, H, L, D) inputs, vmapped as in `run` (invalid shapes must raise)."""
        dev = jax_device(self.device)
        conv = [to_jax(np.asarray(x, dtype=np.float64), dtype, dev) for x in (q, k, v)]
        with precision_context(self.options, dtype):
            out = _attend(*conv, None, None, dropout_p=0.0)
        return to_numpy(out)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **framework_versions(self.device, self.options),
                "kernel": "equinox.nn._attention.dot_product_attention (private; the per-head function "
                          "equinox.nn.MultiheadAttention calls), vmapped over (batch, heads), under jax.jit",
                "convention": "one head (L, D); mask (Lq, Lk) True = attend, masked logits -> finfo(dtype).min; "
                              "no scale argument (custom scales through Q), no bias; causal and padding folded "
                              "into the mask"}


def implementations(device: str, options: dict[str, Any]) -> list[Adapter]:
    from attnconf.adapters.jax.common import enable_x64

    enable_x64()

    device = "gpu" if device == "cuda" else device
    return [EqxDpaAdapter(device, options), EqxMhaAdapter(device, options)]


NO_KERNEL = ("--backend=equinox has no kernel calling convention of its own; give a per-head kernel as "
             "--backend=jax --kernel=MODULE:ATTR (jax.nn.dot_product_attention convention)")


def check_kernel_signature(fn) -> str | None:
    """Every --kernel is refused: equinox has no attention-function convention a kernel could plug into."""
    return NO_KERNEL


def kernel_adapter(fn, device: str, name: str) -> Adapter:
    from attnconf.adapters import UsageError

    raise UsageError(NO_KERNEL)
