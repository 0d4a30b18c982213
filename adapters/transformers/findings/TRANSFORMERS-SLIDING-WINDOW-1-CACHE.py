"""TRANSFORMERS-SLIDING-WINDOW-1-CACHE: with config.sliding_window = 1 and a KV cache, DynamicSlidingWindowLayer
keeps every cached token (`full_key_states[:, :, -self.sliding_window + 1:, :]` is `[:, :, 0:, :]` for
sliding_window = 1) while get_mask_sizes() tells the mask functions that only the new tokens are there. A
prefill of Lq > 1 tokens after a cache raises (mask Lq columns, keys P + Lq); a decoding step (Lq = 1) silently
attends to every cached key.

Needs only transformers (with its torch) and NumPy.
Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
import sys

try:
    import torch
    import transformers
    from transformers import MistralConfig
    from transformers.cache_utils import DynamicCache
    from transformers.masking_utils import create_sliding_window_causal_mask
    from transformers.models.llama.modeling_llama import eager_attention_forward
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


class Layer(torch.nn.Module):
    """The attributes MistralAttention hands to eager_attention_forward."""

    def __init__(self, config):
        super().__init__()
        self.config, self.layer_idx, self.num_key_value_groups, self.is_causal = config, 0, 1, True


def step(past: int, new: int):
    torch.manual_seed(28)
    cfg = MistralConfig(hidden_size=8, num_attention_heads=1, num_key_value_heads=1, head_dim=8,
                        num_hidden_layers=1, vocab_size=8, sliding_window=1)
    cfg._attn_implementation = "eager"
    q = torch.randn(1, 1, new, 8)
    k, v = torch.randn(1, 1, past + new, 8), torch.randn(1, 1, past + new, 8)
    cache = DynamicCache(config=cfg)
    cache.update(k[:, :, :past], v[:, :, :past], 0)
    mask = create_sliding_window_causal_mask(config=cfg, inputs_embeds=torch.zeros(1, new, 8), attention_mask=None,
                                             past_key_values=cache, position_ids=torch.arange(past, past + new)[None])
    keys, values = cache.update(k[:, :, past:], v[:, :, past:], 0)
    print(f"  P={past} Lq={new}: mask {tuple(mask.shape)}, keys from the cache {tuple(keys.shape)}")
    out, _ = eager_attention_forward(Layer(cfg), q, keys, values, mask, scaling=8 ** -0.5)
    return out[0, :, 0], v[0, 0, past:]   # window (0, 0): each query sees only its own key, out = its own v


def main() -> int:
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    raised = wrong = False
    try:
        step(2, 2)
    except RuntimeError as exc:
        raised = True
        print(f"  prefill after a cache raises: {exc}")
    out, own = step(3, 1)
    err = float((out - own).abs().max())
    wrong = err > 1e-3
    print(f"  decoding: output differs from the query's own value by {err:.3g} (should be 0: window of one key)")
    if raised and wrong:
        print("REPRODUCED: sliding_window = 1 with a KV cache raises on prefill and attends to every cached key when decoding")
        return 0
    print("NOT REPRODUCED: the sliding-window cache honours sliding_window = 1")
    return 1


if __name__ == "__main__":
    sys.exit(main())
