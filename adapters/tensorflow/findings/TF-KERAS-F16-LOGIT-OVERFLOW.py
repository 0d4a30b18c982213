"""TF-KERAS-F16-LOGIT-OVERFLOW: keras.ops.dot_product_attention on the TensorFlow backend computes
Q K^T in float16 before applying the scale, so an unscaled product above 65504 becomes inf and
the row NaN, although the scaled logits are representable in float16.

Needs only keras (TensorFlow backend), tensorflow and NumPy.
Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
try:
    import numpy as np
    import tensorflow as tf
    import keras
    from keras import ops
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


def reference(q, k, v, scale):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("btnh,bsnh->bnts", q, k) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", p, v)


def main() -> int:
    print(f"keras {keras.__version__}, tensorflow {tf.__version__}, backend {keras.backend.backend()}")
    rng = np.random.default_rng(12)
    h = 64
    q = np.full((1, 2, 1, h), 40.0, np.float16)  # (B, T, N, H)
    k = np.concatenate([np.full((1, 1, 1, h), 40.0), rng.normal(size=(1, 3, 1, h))], axis=1).astype(np.float16)
    v = rng.normal(size=(1, 4, 1, h)).astype(np.float16)
    scale = 1 / np.sqrt(h)
    qk = np.einsum("btnh,bsnh->bnts", q.astype(np.float64), k.astype(np.float64))
    print(f"max unscaled q.k = {qk.max():.0f} (float16 max 65504); max scaled logit = {qk.max() * scale:.0f}")
    ref = reference(q, k, v, scale)
    out = np.asarray(ops.dot_product_attention(q, k, v)).astype(np.float64)
    prescaled = np.asarray(ops.dot_product_attention((q * np.float16(scale)).astype(np.float16), k, v,
                                                     scale=1.0)).astype(np.float64)
    xla = tf.function(lambda a, b, c: ops.dot_product_attention(a, b, c), jit_compile=True)
    out_xla = np.asarray(xla(q, k, v)).astype(np.float64)
    print(f"eager: NaN elements {int(np.isnan(out).sum())} of {out.size}; "
          f"XLA (jit_compile): NaN elements {int(np.isnan(out_xla).sum())}; reference finite: {bool(np.isfinite(ref).all())}")
    print(f"same call with Q pre-multiplied by the scale (scale=1.0), still float16: "
          f"max |out - reference| = {np.abs(prescaled - ref).max():.2g}")
    # the same overflow downwards: the row's one visible key gets -inf, the masked key tf.where's finite fill
    q2 = np.full((1, 1, 1, 4), 150.0, np.float16)
    k2 = np.array([[[[-150.0] * 4]], [[[0.3, 0.2, -0.4, 0.9]]]], np.float16).reshape(1, 2, 1, 4)
    v2 = np.array([[0.125, -0.25, 0.0625, 0.375], [-1.5, 2.25, 2.0, -3.0]], np.float16).reshape(1, 2, 1, 4)
    mask = np.array([[[[True, False]]]])                           # (B, N, T, S): key 1 masked
    got = np.asarray(ops.dot_product_attention(q2, k2, v2, mask=mask)).astype(np.float64)[0, 0, 0]
    print(f"q.k = -90000 at the row's one visible key, its other key masked: output {got.tolist()}, "
          f"the visible key's value {v2[0, 0, 0].astype(float).tolist()}, the masked key's {v2[0, 1, 0].astype(float).tolist()}")
    if np.isnan(out).any() and np.isfinite(ref).all():
        print("REPRODUCED: float16 attention returns NaN because Q K^T overflows before scaling "
              f"(unscaled {qk.max():.0f} > 65504, scaled {qk.max() * scale:.0f})")
        return 0
    print(f"NOT REPRODUCED: output is finite (max err {np.abs(out - ref).max():.2g})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
