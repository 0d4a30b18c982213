"""TRANSFORMERS-FLEX-CPU-COMPILE-ERROR: transformers' flex_attention path on CPU (which runs
torch.compile(flex_attention)) fails with a C++ compile error from inductor on the third of three ordinary
calls with the same shapes: a decode-style causal mask with a KV cache, a user's BlockMask, then a padding
mask. Each call alone works; the third, recompiled with dynamic shapes, generates C++ that uses an undeclared
`cur_kvSplitSize0`.

Needs only transformers (with its torch and a C++ compiler, which torch.compile needs on CPU) and NumPy.
Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
import os
import sys
import tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")   # no cached kernels: deterministic
try:
    import numpy as np
    import torch
    import transformers
    from torch.nn.attention.flex_attention import create_block_mask
    from transformers import MistralConfig
    from transformers.cache_utils import DynamicCache
    from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


class Layer(torch.nn.Module):
    """The attributes an attention layer hands to the attention function."""

    def __init__(self, is_causal: bool):
        super().__init__()
        self.is_causal = is_causal
        self.num_key_value_groups = 1


def main() -> int:
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    flex = ALL_ATTENTION_FUNCTIONS["flex_attention"]
    cfg = MistralConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                        num_hidden_layers=1, vocab_size=8)
    cfg._attn_implementation = "flex_attention"
    rng = np.random.default_rng(0)
    B, H, Lq, Lk, D = 2, 2, 5, 7, 8

    def qkv():
        return [torch.from_numpy(rng.normal(size=(B, H, n, D))).float() for n in (Lq, Lk, Lk)]

    def with_cache():   # 5 new tokens after 2 cached ones, the mask as MistralModel builds it
        q, k, v = qkv()
        cache = DynamicCache(config=cfg)
        cache.update(k[:, :, :2], v[:, :, :2], 0)
        m = create_causal_mask(config=cfg, inputs_embeds=torch.zeros(B, Lq, 16), attention_mask=None,
                               past_key_values=cache, position_ids=torch.arange(2, Lk)[None])
        k, v = cache.update(k[:, :, 2:], v[:, :, 2:], 0)
        return q, k, v, m, True

    def user_block_mask():   # a custom mask given as a BlockMask (top-left causal)
        q, k, v = qkv()
        keep = torch.tril(torch.ones(Lq, Lk, dtype=torch.bool))
        return q, k, v, create_block_mask(lambda b, h, i, j: keep[i, j], B, None, Lq, Lk, device="cpu"), True

    def padding():   # cross-attention with a 2D padding mask
        q, k, v = qkv()
        pad = torch.tensor([[1, 1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 0, 1, 1]], dtype=torch.bool)
        return q, k, v, create_bidirectional_mask(cfg, torch.zeros(B, Lq, 16), pad,
                                                  encoder_hidden_states=torch.zeros(B, Lk, 16)), False

    for name, make in (("cache", with_cache), ("block_mask", user_block_mask), ("padding", padding)):
        q, k, v, mask, causal = make()
        try:
            out, _ = flex(Layer(causal).eval(), q, k, v, mask, scaling=D ** -0.5, dropout=0.0)
        except Exception as exc:  # noqa: BLE001 (any failure of an ordinary call is the defect)
            errors = [ln.split("error:", 1)[1].strip() for ln in str(exc).splitlines() if "error:" in ln]
            print(f"{name}: {type(exc).__name__}: {errors[0] if errors else str(exc)[:200]}")
            print(f"REPRODUCED: flex_attention call '{name}' raised {type(exc).__name__} "
                  f"({errors[0][:80] if errors else 'no compiler message'})")
            return 0
        print(f"{name}: ok, output {tuple(out.shape)}, finite {bool(torch.isfinite(out).all())}")
    print("NOT REPRODUCED: all three calls compiled and ran")
    return 1


if __name__ == "__main__":
    sys.exit(main())
