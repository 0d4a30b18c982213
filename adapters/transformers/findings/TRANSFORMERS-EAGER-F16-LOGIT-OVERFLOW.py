"""TRANSFORMERS-EAGER-F16-LOGIT-OVERFLOW: transformers' eager attention (llama's eager_attention_forward) forms
Q K^T in float16 and scales it afterwards, so an unscaled dot product above 65504 is +inf; adding the mask
(finfo(float16).min) leaves +inf and the row's softmax is NaN, even when the key is masked out and even
though the scaled logit is representable.

Needs only transformers (with its torch) and NumPy.
Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
import sys

try:
    import numpy as np
    import torch
    import transformers
    from transformers import LlamaConfig
    from transformers.masking_utils import create_bidirectional_mask
    from transformers.models.llama.modeling_llama import eager_attention_forward
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


class Layer(torch.nn.Module):
    """The attributes LlamaAttention hands to eager_attention_forward."""

    def __init__(self):
        super().__init__()
        self.num_key_value_groups = 1


def main() -> int:
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    rng = np.random.default_rng(27)
    d = 64
    q = np.full((1, 1, 2, d), 8.0)                       # float16-exact inputs
    k = rng.normal(size=(1, 1, 4, d)).astype(np.float16).astype(np.float64)
    k[..., 0, :] = 160.0                                  # key 0: q.k = 81920 > 65504; scaled: 10240
    v = rng.normal(size=(1, 1, 4, 8)).astype(np.float16).astype(np.float64)
    padding = torch.tensor([[0, 1, 1, 1]])                # key 0 is a padding token: masked for every query
    scale = d ** -0.5

    # float64 reference over the visible keys 1..3
    s = np.einsum("bhid,bhjd->bhij", q, k)[..., 1:] * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v[..., 1:, :]
    print(f"unscaled logit of the masked key {float(q[0, 0, 0] @ k[0, 0, 0]):.0f}, scaled {float(q[0, 0, 0] @ k[0, 0, 0]) * scale:.0f}")

    config = LlamaConfig(hidden_size=64, num_attention_heads=1, num_key_value_heads=1, num_hidden_layers=1,
                         vocab_size=8)
    config._attn_implementation = "eager"
    found = False
    for dtype in (torch.float32, torch.float16):
        mask = create_bidirectional_mask(config, torch.zeros(1, 2, 64, dtype=dtype), padding)
        out, _ = eager_attention_forward(Layer().eval(), *(torch.from_numpy(x).to(dtype) for x in (q, k, v)), mask,
                                         scaling=scale)
        out = out.transpose(1, 2).double().numpy()
        nan = int(np.isnan(out).sum())
        err = float(np.nanmax(np.abs(out - ref))) if nan < out.size else float("nan")
        print(f"{str(dtype):14s} NaN outputs {nan} of {out.size}; max error of the finite ones {err:.3g}")
        if dtype == torch.float16 and nan:
            found = True
    # Criterion: the reference is finite (all logits of visible keys are ordinary) and float32 agrees with it;
    # any NaN in float16 is the overflow.
    if found:
        print("REPRODUCED: float16 eager attention returns NaN when a masked key's unscaled q.k exceeds 65504")
        return 0
    print("NOT REPRODUCED: float16 output is finite")
    return 1


if __name__ == "__main__":
    sys.exit(main())
