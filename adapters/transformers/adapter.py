"""The `transformers` backend: Hugging Face transformers' attention functions, called as its models call them.

Implementations (one adapter each, so every result names the function that produced it):

- `transformers:eager`: `models/llama/modeling_llama.py::eager_attention_forward` (Mistral's is the same
  function), reached through `ALL_ATTENTION_FUNCTIONS.get_interface("eager", ...)` as LlamaAttention does;
- `transformers:eager-softcap`: `models/gemma2/modeling_gemma2.py::eager_attention_forward`, which applies
  `softcap` (Gemma2Attention passes `softcap=config.attn_logit_softcapping`);
- `transformers:eager-sinks`: `models/gpt_oss/modeling_gpt_oss.py::eager_attention_forward`, which reads the
  per-head sink logits from `module.sinks`;
- `transformers:sdpa`: `ALL_ATTENTION_FUNCTIONS["sdpa"]` (`integrations/sdpa_attention.py`);
- `transformers:flex`: `ALL_ATTENTION_FUNCTIONS["flex_attention"]` (`integrations/flex_attention.py`, which
  runs `torch.compile(flex_attention)`; on CPU it returns no LSE and has no backward).

How a Case reaches them (`plan()`, in plan.py), in one of two modes:

- **model**: the mask is built by `transformers.masking_utils` from what a model knows: `create_causal_mask`,
  `create_sliding_window_causal_mask` (config `sliding_window = w`), `create_bidirectional_mask` (encoder
  self-attention, or cross-attention with `encoder_hidden_states` when Lq != Lk) and
  `create_bidirectional_sliding_window_mask` (ModernBERT's), from a 2D padding `attention_mask` (B, Lk)
  and, when Lk > Lq, a `DynamicCache` that already holds the first P = Lk - Lq keys/values (built with the
  model's config, so a sliding layer's cache keeps only the last w - 1). The masks are built before the
  cache is updated, then the layer's `past_key_values.update(...)` returns the keys/values the attention
  function sees, exactly as in e.g. `MistralModel.forward` / `MistralAttention.forward`. Positions are
  absolute: the Lq queries are positions P..Lk-1, so causal masking and windows are aligned bottom-right.
- **custom**: a 4D mask prepared by the caller, which models pass through unchanged
  (`masking_utils._preprocess_mask_arguments`: "If the mask is already 4D, simply return as-is"). Used for
  what model mode cannot express (a boolean mask that varies over queries or heads, top-left causal with
  Lq < Lk, bottom-right causal with per-batch lengths). It is built the way transformers builds its own:
  for eager, a float mask with 0 where visible and `torch.finfo(dtype).min` where hidden
  (`masking_utils.eager_mask`), plus the case's bias; for sdpa a boolean mask; for flex a `BlockMask`.

Which Case windows map to which transformers configuration (ATTN-WIN, both bounds inclusive around
j = i + offset):

- `window=(w - 1, 0)` (or `(w - 1, R)` under causal masking) <-> `config.sliding_window = w`:
  `sliding_window_overlay` keeps `kv_idx > q_idx - w` and the causal function `kv_idx <= q_idx`, i.e.
  w keys including the query's own position. Without a cache (Lq == Lk) the alignments coincide; with a
  cache of P tokens the diagonal is j = i + P: `window_align="bottom_right"`. Top-left with Lq != Lk has
  no model-mode expression and is unsupported.
- `window=(w, w)`, no causal masking, Lq == Lk <-> `create_bidirectional_sliding_window_mask` with
  `config.sliding_window = w` (`abs(q_idx - kv_idx) <= sliding_window`).
- `window=(-1, 0)` is plain causal masking. Every other window is unsupported.

(Measured on 5.23.0 with sliding_window=2, row 3 of 6: `create_bidirectional_sliding_window_mask` keeps keys
1..5, window (2, 2); Gemma3's bidirectional overlay, `abs(q_idx - kv_idx) < sliding_window` OR'ed onto the
causal sliding mask, keeps 2..4, window (1, 1): one config value, two windows, each model consistent with
its own flash-attention call, `window_size=(sliding_window - 1, sliding_window - 1)` since #40163.)
In 5.23.0 the mask functions take no `cache_position`: query positions come from
`past_key_values.get_query_offset()` and key positions from `get_mask_sizes()`, which is what the cache
here provides.

What the library has no way to say is unsupported: query padding (`q_lengths`), ALiBi slopes, sinks
except through gpt-oss's eager function, softcap through sdpa (it raises), dropout through flex (it
raises), a window together with a custom 4D mask (a custom mask replaces the mask functions).
Scores are scaled by `scaling=` (every model passes `self.scaling`), so the default scale is passed
explicitly as 1/sqrt(Dk).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Literal

import numpy as np
import torch
import transformers
from transformers import Gemma2Config, GptOssConfig, MistralConfig
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_bidirectional_sliding_window_mask,
    create_causal_mask,
    create_sliding_window_causal_mask,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.gemma2 import modeling_gemma2
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.models.llama import modeling_llama

from attnconf.reference import Case
from attnconf.spec.vocabulary import DTYPES

from attnconf.adapters.base import Adapter, KernelError, Result
from attnconf.adapters.torch.convert import TORCH_DTYPES, device_info, dtype_name, set_precision, to_numpy, to_tensor
from attnconf.adapters.torch.sdpa import _clean, _equal_over_batch, _input
from attnconf.adapters.transformers.plan import Plan, plan

FRAMEWORK = "torch"
INSTALL_HINT = "pip install transformers (next to torch==2.13.0; measured with transformers==5.23.0)"
DEVICES = ("cpu",)
MEASURED_VERSION = "5.23.0"

BASE_CAPS = frozenset({"mask", "bias", "causal_top_left", "causal_bottom_right", "kv_lengths", "gqa",
                       "custom_scale", "dv_ne_dk", "cross", "mask_with_causal", "noncontiguous", "broadcast_kv",
                       "window_top_left", "window_bottom_right"})


# ---------------------------------------------------------------------------------------------------------
# The module and config a model would hand to the attention function
# ---------------------------------------------------------------------------------------------------------

class _AttentionModule(torch.nn.Module):
    """The attributes an attention layer (LlamaAttention, Gemma2Attention, GptOssAttention) carries."""

    def __init__(self, config, *, hq: int, hkv: int, head_dim: int, scaling: float, is_causal: bool,
                 sliding_window: int | None, softcap: float | None, dropout: float, sinks=None):
        super().__init__()
        self.config = config
        self.layer_idx = 0
        self.head_dim = head_dim
        self.num_key_value_groups = hq // hkv
        self.scaling = scaling
        self.is_causal = is_causal
        self.attention_dropout = dropout
        self.sliding_window = sliding_window
        self.attn_logit_softcapping = softcap
        if sinks is not None:
            self.sinks = torch.nn.Parameter(sinks, requires_grad=False)


class TransformersAdapter(Adapter):
    """One of transformers' attention functions; subclasses name the function and what it can do."""

    backend = "transformers"
    kind = "sdpa"
    dtypes = DTYPES
    config_class: type = MistralConfig
    interface_key = ""                       # key of ALL_ATTENTION_FUNCTIONS ("eager": the model's own function)
    mask_key = ""                            # config._attn_implementation, which picks the mask interface
    model_function: Callable | None = None   # the eager function the model falls back to
    bias_in_model_mode = False
    source = ""

    def __init__(self, device: str = "cpu"):
        super().__init__(device)

    # -- support -------------------------------------------------------------
    def extra_support(self, case: Case) -> Literal[True] | str:
        if case.layout == "broadcast_kv" and not _equal_over_batch(case):
            return "layout broadcast_kv needs K and V equal across the batch"
        p = plan(case, bias_in_model_mode=self.bias_in_model_mode)
        if isinstance(p, str):
            return f"{self.name}: {p}"
        return self.impl_support(case, p)

    def impl_support(self, case: Case, p: Plan) -> Literal[True] | str:
        return True

    # -- the call -----------------------------------------------------------------
    def function(self) -> Callable:
        if self.interface_key == "eager":
            return ALL_ATTENTION_FUNCTIONS.get_interface("eager", self.model_function)
        return ALL_ATTENTION_FUNCTIONS[self.interface_key]

    def config(self, case: Case, p: Plan):
        """The model config the mask functions and the cache read: `_attn_implementation`, `sliding_window`,
        `layer_types` (one layer) and `is_causal`. Their head sizes play no part in masking, so they are fixed
        (a head_dim from the case would have to pass the config's RoPE validation, which odd sizes fail)."""
        kw: dict[str, Any] = dict(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                  num_hidden_layers=1, vocab_size=8)
        window = p.sliding_window if p.sliding_window is not None else p.bidirectional_window
        if self.config_class is MistralConfig:
            cfg = MistralConfig(sliding_window=window, **kw)
        else:
            layer = "sliding_attention" if window is not None else "full_attention"
            extra = {"attn_logit_softcapping": case.softcap, "final_logit_softcapping": None} \
                if self.config_class is Gemma2Config else {}
            cfg = self.config_class(sliding_window=window, layer_types=[layer], **extra, **kw)
        cfg._attn_implementation = self.mask_key
        if p.bidirectional_window is not None or (p.mode == "model" and not p.is_causal):
            cfg.is_causal = False
        return cfg

    def mask(self, case: Case, p: Plan, cfg, k_all, v_all, dtype: torch.dtype):
        """(attention_mask, keys, values): the mask the model builds, and what the layer's cache returns."""
        s = case.shape
        B, Lq, Lk = s["B"], s["Lq"], s["Lk"]
        dev = self.device
        embeds = torch.zeros(B, Lq, s["Hq"] * s["Dk"], dtype=dtype, device=dev)
        pad = None if p.padding is None else torch.from_numpy(p.padding).to(dev)
        if p.mode == "custom":
            return self.custom_mask(case, p, dtype), k_all, v_all
        if not p.is_causal:
            enc = torch.zeros(B, Lk, s["Hq"] * s["Dk"], dtype=dtype, device=dev) if p.cross else None
            if p.bidirectional_window is not None:
                m = create_bidirectional_sliding_window_mask(cfg, embeds, pad)
            else:
                m = create_bidirectional_mask(cfg, embeds, pad, encoder_hidden_states=enc)
            return m, k_all, v_all
        P = p.past
        cache = None
        if P:
            cache = DynamicCache(config=cfg)
            cache.update(k_all[:, :, :P], v_all[:, :, :P], 0)
        position_ids = torch.arange(P, Lk, device=dev)[None]
        build = create_sliding_window_causal_mask if p.sliding_window is not None else create_causal_mask
        m = build(config=cfg, inputs_embeds=embeds, attention_mask=pad, past_key_values=cache,
                  position_ids=position_ids)
        if cache is None:
            return m, k_all, v_all
        keys, values = cache.update(k_all[:, :, P:], v_all[:, :, P:], 0)
        return m, keys, values

    def custom_mask(self, case: Case, p: Plan, dtype: torch.dtype):
        raise NotImplementedError

    def kwargs(self, case: Case, p: Plan, leaves: dict[str, torch.Tensor]) -> dict[str, Any]:
        return {}

    def module(self, case: Case, p: Plan, cfg) -> _AttentionModule:
        s = case.shape
        return _AttentionModule(cfg, hq=s["Hq"], hkv=s["Hkv"], head_dim=s["Dk"], scaling=float(case.effective_scale),
                                is_causal=p.is_causal or p.mode == "custom" and case.causal is not None,
                                sliding_window=p.sliding_window, softcap=case.softcap, dropout=case.dropout_p)

    def run(self, case: Case, *, grads: bool = False) -> Result:
        p = plan(case, bias_in_model_mode=self.bias_in_model_mode)
        if isinstance(p, str):
            raise KernelError(f"{self.name} was asked to run a case it does not support: {p}")
        dev, t = self.device, case.dtype
        dtype = TORCH_DTYPES[t]
        q, k, v = (_input(x, t, dev, grads=grads, layout=case.layout, kv=name != "q")
                   for name, x in (("q", case.q), ("k", case.k), ("v", case.v)))
        leaves: dict[str, torch.Tensor] = {"dq": q, "dk": k, "dv": v}
        if case.bias is not None:
            bias = to_tensor(case.bias.reshape((1,) * (4 - case.bias.ndim) + case.bias.shape), t, dev)
            leaves["dbias"] = bias.requires_grad_(grads and "dbias" in self.capabilities)
        cfg = self.config(case, p)
        module = self.module(case, p, cfg)
        module.train(bool(case.dropout_p))
        if case.dropout_p:
            torch.manual_seed(case.seed)
        fn = self.function()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                mask, keys, values = self.mask(case, p, cfg, k, v, dtype)
                if p.mode == "custom" and "dbias" in leaves and self.bias_in_custom_mask:
                    mask = self.with_bias(p, leaves["dbias"], dtype)
                kw = self.kwargs(case, p, leaves)
                n = keys.shape[-2]
                if "position_bias" in kw and kw["position_bias"].shape[-1] > n:
                    # a sliding layer's cache returns only the last n keys (the others are outside every window):
                    # a model's position_bias covers the keys the layer attends to, so the bias of those n
                    kw["position_bias"] = kw["position_bias"][..., -n:]
                out, extra = fn(module, q, keys, values, mask, dropout=case.dropout_p, scaling=float(case.effective_scale),
                                sliding_window=p.sliding_window, **kw)
            except Exception as exc:
                raise KernelError(f"{self.name} raised {type(exc).__name__}: {_clean(str(exc))}") from exc
        out = out.transpose(1, 2)  # the functions return (B, Lq, Hq, Dv), ready for o_proj
        res = Result(out=to_numpy(out), out_dtype=dtype_name(out), kernel=f"{self.source}; {p.describe()}")
        self.collect(res, extra, case)
        if grads:
            if case.grad_out is None:
                raise ValueError("grads=True needs case.grad_out")
            names = [n for n in leaves if leaves[n].requires_grad]
            go = to_tensor(case.grad_out, t, dev)
            try:
                gs = torch.autograd.grad(out, [leaves[n] for n in names], go, allow_unused=True)
            except Exception as exc:
                raise KernelError(f"{self.name} backward raised {type(exc).__name__}: {_clean(str(exc))}") from exc
            res.grads = {n: to_numpy(g if g is not None else torch.zeros_like(leaves[n])) for n, g in zip(names, gs)}
            if "dbias" in res.grads:  # the bias went in as 4D (leading 1s added); give it back in its own shape
                res.grads["dbias"] = res.grads["dbias"].reshape(case.bias.shape)
        return res

    bias_in_custom_mask = True

    def with_bias(self, p: Plan, bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A float custom mask carrying the case's bias: the bias where the boolean parts let a key through,
        finfo(dtype).min where they hide it. This is how transformers itself merges a boolean mask with a
        float bias (`integrations/sdpa_attention.py::create_position_bias_mask`:
        `torch.where(attention_mask, position_bias, min_dtype)`); a -inf in the bias stays -inf."""
        vis = torch.from_numpy(np.ascontiguousarray(p.custom)).to(self.device)
        return torch.where(vis, bias, torch.finfo(dtype).min)

    def collect(self, res: Result, extra, case: Case) -> None:
        """Record what the function returns besides the output (weights for eager, nothing otherwise)."""

    def run_raw(self, q, k, v, dtype):
        """Call the function as a layer would, on shapes a layer would never produce (ATTN-OP-6)."""
        qt, kt, vt = (to_tensor(x, dtype, self.device) for x in (q, k, v))
        hq, hkv = q.shape[1], max(k.shape[1], 1)
        cfg = MistralConfig(hidden_size=8, num_attention_heads=1, num_key_value_heads=1, num_hidden_layers=1,
                            vocab_size=8, head_dim=8)
        cfg._attn_implementation = self.mask_key
        module = _AttentionModule(cfg, hq=hq, hkv=hkv, head_dim=q.shape[-1], scaling=q.shape[-1] ** -0.5,
                                  is_causal=False, sliding_window=None, softcap=None, dropout=0.0,
                                  sinks=torch.zeros(hq, dtype=TORCH_DTYPES[dtype]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out, _ = self.function()(module, qt, kt, vt, None, dropout=0.0, scaling=q.shape[-1] ** -0.5)
        return to_numpy(out.transpose(1, 2))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **device_info(self.device), "transformers": transformers.__version__,
                "kernel": self.source}


class EagerAdapter(TransformersAdapter):
    """LlamaAttention's `eager_attention_forward` (also Mistral's, Qwen2's, ...)."""

    name = "transformers:eager"
    interface_key = "eager"
    mask_key = "eager"
    model_function = staticmethod(modeling_llama.eager_attention_forward)
    capabilities = BASE_CAPS | {"weights", "grads", "dbias", "dropout"}
    source = "models/llama/modeling_llama.py eager_attention_forward"

    def impl_support(self, case: Case, p: Plan) -> Literal[True] | str:
        if case.dropout_p and case.dtype == "float64":
            return self._float64_dropout()
        return True

    def cell_refusal(self, needs: tuple[str, ...], dtype: str | None) -> str | None:
        return self._float64_dropout() if dtype == "float64" and "dropout" in needs else None

    def _float64_dropout(self) -> str:
        # The float64 softmax runs in float32 (TRANSFORMERS-EAGER-F64-SOFTMAX-F32): a float64 dropout call is
        # float32-accurate, and a dropout output has no element-wise reference against which a precision
        # divergence could be checked (the dropout tests hold kept weights to the float64 allowance).
        return (f"{self.name}: dropout in float64 (the float64 softmax runs in float32, and a dropout output "
                f"cannot be judged against a precision divergence)")

    def custom_mask(self, case: Case, p: Plan, dtype: torch.dtype):
        """transformers' eager convention (masking_utils.eager_mask): 0 where visible, finfo(dtype).min where hidden."""
        vis = torch.from_numpy(np.ascontiguousarray(p.custom)).to(self.device)
        return torch.where(vis, torch.zeros((), dtype=dtype, device=self.device), torch.finfo(dtype).min)

    def collect(self, res: Result, extra, case: Case) -> None:
        if isinstance(extra, torch.Tensor) and not case.dropout_p:
            w = to_numpy(extra)
            lk = case.shape["Lk"]
            if w.shape[-1] < lk:   # a sliding layer's cache evicted the first keys: outside the window, weight 0
                w = np.concatenate([np.zeros(w.shape[:-1] + (lk - w.shape[-1],), dtype=w.dtype), w], axis=-1)
            res.weights = w


class EagerSoftcapAdapter(EagerAdapter):
    """Gemma2Attention's `eager_attention_forward`: logits -> softcap * tanh(logits / softcap) before the mask."""

    name = "transformers:eager-softcap"
    config_class = Gemma2Config
    model_function = staticmethod(modeling_gemma2.eager_attention_forward)
    capabilities = EagerAdapter.capabilities | {"softcap"}
    source = "models/gemma2/modeling_gemma2.py eager_attention_forward"

    def kwargs(self, case, p, leaves):
        return {"softcap": case.softcap}


class EagerSinksAdapter(EagerAdapter):
    """GptOssAttention's `eager_attention_forward`: a per-head sink logit (`module.sinks`) joins the softmax."""

    name = "transformers:eager-sinks"
    config_class = GptOssConfig
    model_function = staticmethod(modeling_gpt_oss.eager_attention_forward)
    capabilities = EagerAdapter.capabilities | {"sinks"}
    requires = frozenset({"sinks"})      # gpt-oss's eager function always reads module.sinks
    source = "models/gpt_oss/modeling_gpt_oss.py eager_attention_forward"

    def module(self, case, p, cfg):
        m = super().module(case, p, cfg)
        m.sinks = torch.nn.Parameter(to_tensor(case.sinks, case.dtype, self.device), requires_grad=False)
        return m


class SdpaAdapter(TransformersAdapter):
    """`integrations/sdpa_attention.py::sdpa_attention_forward`; a bias goes in as T5's `position_bias`."""

    name = "transformers:sdpa"
    interface_key = "sdpa"
    mask_key = "sdpa"
    bias_in_model_mode = True
    bias_in_custom_mask = False
    capabilities = BASE_CAPS | {"grads", "dbias", "dropout"}
    source = "integrations/sdpa_attention.py sdpa_attention_forward"

    def custom_mask(self, case: Case, p: Plan, dtype):
        return torch.from_numpy(np.ascontiguousarray(p.custom)).to(self.device)

    def kwargs(self, case, p, leaves):
        return {"position_bias": leaves["dbias"]} if "dbias" in leaves else {}


class FlexAdapter(TransformersAdapter):
    """`integrations/flex_attention.py::flex_attention_forward` (torch.compile'd flex_attention)."""

    name = "transformers:flex"
    interface_key = "flex_attention"
    mask_key = "flex_attention"
    bias_in_model_mode = True
    bias_in_custom_mask = False
    capabilities = BASE_CAPS | {"softcap"}
    # Every new graph (dtype, score_mod closure, mask kind, shape before dynamic shapes kick in) is compiled by
    # inductor to C++ (g++): 5-60 s each on this shared 2-core machine (measured: 40 s for the first two calls,
    # 3-14 s for later new graphs; the ci profile at budget 1.0 had finished 4 of 47 tests after 35 min).
    # At 0.04 (one example per property test) the ci run of transformers:flex alone took 3 min 54 s with a cold
    # inductor cache and 50 s with a warm one (load average 3-5 on 2 cores: noisy).
    example_budget = 0.04
    # torch 2.13's compiled CPU flex_attention raises for float64 ("`torch.float` , `torch.float16` and
    # `torch.bfloat16` are supported in FlexAttention for CPU device").
    dtypes = ("float32", "float16", "bfloat16")
    source = "integrations/flex_attention.py flex_attention_forward (torch.compile(flex_attention))"

    def custom_mask(self, case: Case, p: Plan, dtype):
        from torch.nn.attention.flex_attention import create_block_mask

        s = case.shape
        vis = torch.from_numpy(np.ascontiguousarray(p.custom)).to(self.device)
        heads = vis.shape[1]

        def mask_mod(b, h, i, j):
            return vis[b, h if heads > 1 else 0, i, j]
        return create_block_mask(mask_mod, s["B"], heads if heads > 1 else None, s["Lq"], s["Lk"], device=self.device)

    def kwargs(self, case, p, leaves):
        kw: dict[str, Any] = {"softcap": case.softcap}
        if "dbias" in leaves:
            s = case.shape
            kw["position_bias"] = leaves["dbias"].expand(s["B"], s["Hq"], s["Lq"], s["Lk"]).contiguous()
        return kw


IMPLEMENTATIONS: tuple[type[TransformersAdapter], ...] = (EagerAdapter, EagerSoftcapAdapter, EagerSinksAdapter,
                                                          SdpaAdapter, FlexAdapter)


def implementations(device: str, options: dict[str, Any]) -> list[Adapter]:
    set_precision(options)
    return [cls(device) for cls in IMPLEMENTATIONS]


__all__ = ["DEVICES", "FRAMEWORK", "IMPLEMENTATIONS", "INSTALL_HINT", "MEASURED_VERSION", "Plan",
           "implementations", "plan"]
