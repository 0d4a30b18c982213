"""TRANSFORMERS-EAGER-F64-SOFTMAX-F32: transformers' eager attention (llama's eager_attention_forward, used by
Llama, Mistral, Qwen2, ... and gemma2's) computes the softmax of float64 inputs in float32. Float64 attention
is therefore only float32-accurate, and a row that sees no key (left padding under a causal mask) is NaN:
the float64 mask value torch.finfo(float64).min becomes -inf in float32.

Needs only transformers (with its torch) and NumPy.
Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
import sys

try:
    import numpy as np
    import torch
    import transformers
    from transformers import LlamaConfig
    from transformers.masking_utils import create_causal_mask
    from transformers.models.llama.modeling_llama import eager_attention_forward
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


class Layer(torch.nn.Module):
    """The attributes LlamaAttention hands to eager_attention_forward."""

    def __init__(self):
        super().__init__()
        self.num_key_value_groups = 1


def reference(q, k, v, scale, visible):
    """float64 softmax attention; rows with no visible key give 0."""
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    s = np.where(visible, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    den = p.sum(-1, keepdims=True)
    p = np.where(den > 0, p / np.where(den > 0, den, 1.0), 0.0)
    return np.einsum("bhij,bhjd->bhid", p, v)


def main() -> int:
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    layer = Layer().eval()
    rng = np.random.default_rng(26)

    # 1. float64, nothing masked: float64 attention of this size is accurate to ~1e-15.
    q, k, v = (rng.normal(size=(1, 2, 8, 16)) for _ in range(3))
    scale = 16 ** -0.5
    out, _ = eager_attention_forward(layer, *(torch.from_numpy(x) for x in (q, k, v)), None, scaling=scale)
    out = out.transpose(1, 2).numpy()
    err = np.abs(out - reference(q, k, v, scale, np.ones((1, 2, 8, 8), bool))).max()
    print(f"float64, no mask: output dtype {out.dtype}; max error vs float64 reference {err:.3g}")

    # 2. A left-padded causal batch, the mask built as LlamaModel builds it (config._attn_implementation='eager').
    config = LlamaConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1,
                         vocab_size=8)
    config._attn_implementation = "eager"
    attention_mask = torch.tensor([[0, 0, 1, 1, 1, 1]])                # two padding tokens on the left
    q, k, v = (rng.normal(size=(1, 2, 6, 8)) for _ in range(3))
    rows = {}
    for dtype in (torch.float32, torch.float64):
        mask = create_causal_mask(config=config, inputs_embeds=torch.zeros(1, 6, 16, dtype=dtype),
                                  attention_mask=attention_mask, past_key_values=None,
                                  position_ids=torch.arange(6)[None])
        o, _ = eager_attention_forward(layer, *(torch.from_numpy(x).to(dtype) for x in (q, k, v)), mask,
                                       scaling=8 ** -0.5)
        rows[dtype] = o.transpose(1, 2)[0, :, :2].double().numpy()     # the two padded query rows
        print(f"{str(dtype):14s} mask value {mask.min().item():.4g}; padded rows NaN: {bool(np.isnan(rows[dtype]).any())}; "
              f"other rows NaN: {bool(np.isnan(o.transpose(1, 2)[0, :, 2:].numpy()).any())}")

    # Criterion (derived): float64 error above 1e-10 (10^5 x float64 rounding here) means float32 arithmetic;
    # NaN in the padded rows in float64 while float32 gives finite values there.
    slow = err > 1e-10
    nan64 = bool(np.isnan(rows[torch.float64]).all()) and bool(np.isfinite(rows[torch.float32]).all())
    if slow or nan64:
        parts = []
        if slow:
            parts.append(f"float64 output off by {err:.2g} (float32 softmax)")
        if nan64:
            parts.append("left-padded rows are NaN in float64 (finite in float32)")
        print("REPRODUCED: " + "; ".join(parts))
        return 0
    print(f"NOT REPRODUCED: float64 error {err:.2g}, padded rows finite")
    return 1


if __name__ == "__main__":
    sys.exit(main())
