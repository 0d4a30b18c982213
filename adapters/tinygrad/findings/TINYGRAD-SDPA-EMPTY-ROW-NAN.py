"""TINYGRAD-SDPA-EMPTY-ROW-NAN: Tensor.scaled_dot_product_attention returns NaN for a query row whose
attn_mask hides every key, and the NaN row poisons dK and dV of the whole head.

Needs only tinygrad (with a working CPU device: clang on PATH) and NumPy.
Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
import sys

try:
    import numpy as np
    from tinygrad import Tensor, dtypes
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


def reference(q, k, v, mask):
    """float64 attention; a row that sees no key outputs 0 (torch SDPA since 2.5, flash-attention, ONNX)."""
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    s = np.where(mask, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(mask, np.exp(s - m), 0.0)
    den = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
    return p @ v


def main() -> int:
    try:
        import tinygrad
        version = getattr(tinygrad, "__version__", None)
        if version is None:
            from importlib.metadata import version as _v
            version = _v("tinygrad")
        rng = np.random.default_rng(1)
        q, k, v = (rng.normal(size=s).astype(np.float32) for s in ((1, 1, 4, 8), (1, 1, 6, 8), (1, 1, 6, 8)))
        mask = np.ones((1, 1, 4, 6), dtype=bool)
        mask[..., 1, :] = False                                   # query row 1 may attend to nothing
        Q, K, V = Tensor(q, device="CPU"), Tensor(k, device="CPU"), Tensor(v, device="CPU")
        out = Q.scaled_dot_product_attention(K, V, attn_mask=Tensor(mask, device="CPU"))
        dq, dk, dv = out.gradient(Q, K, V, gradient=Tensor(np.ones((1, 1, 4, 8), np.float32), device="CPU"))
        o, gq, gk, gv = (t.numpy() for t in (out, dq, dk, dv))
        bias_out = Q.scaled_dot_product_attention(
            K, V, attn_mask=Tensor(np.where(mask, 0.0, -np.inf).astype(np.float32), device="CPU")).numpy()
        half = Q.cast(dtypes.float16).scaled_dot_product_attention(
            K.cast(dtypes.float16), V.cast(dtypes.float16), attn_mask=Tensor(mask, device="CPU")).float().numpy()
    except Exception as exc:  # no clang, no CPU device
        print(f"CANNOT RUN: tinygrad's CPU device failed (it needs clang on PATH): {type(exc).__name__}: "
              f"{str(exc).splitlines()[0] if str(exc) else ''}")
        return 2
    ref = reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), mask)
    print(f"tinygrad {version}")
    print(f"row 1 (fully masked), bool mask:  {np.array2string(o[0, 0, 1, :4], precision=3)} ...  reference {ref[0, 0, 1, :4]}")
    print(f"row 1, the same mask as a -inf float mask: {np.array2string(bias_out[0, 0, 1, :4], precision=3)} ...")
    print(f"row 1, float16: {np.array2string(half[0, 0, 1, :4], precision=3)} ...")
    others = [0, 2, 3]
    print(f"other rows: max |out - reference| = {np.abs(o[0, 0, others] - ref[0, 0, others]).max():.2e}")
    print(f"gradients with dO = 1: dQ NaN in {int(np.isnan(gq).sum())}/{gq.size} elements, "
          f"dK NaN in {int(np.isnan(gk).sum())}/{gk.size}, dV NaN in {int(np.isnan(gv).sum())}/{gv.size}")
    nan_row = bool(np.isnan(o[0, 0, 1]).all() and np.isnan(bias_out[0, 0, 1]).all())
    if nan_row and np.isfinite(ref).all():
        print("REPRODUCED: a fully-masked query row of Tensor.scaled_dot_product_attention is NaN (reference 0), "
              f"and its backward makes {int(np.isnan(gv).sum())} of {gv.size} dV elements NaN")
        return 0
    print("NOT REPRODUCED: the fully-masked row is finite "
          f"(row 1 = {o[0, 0, 1, :4]}, dV NaN count {int(np.isnan(gv).sum())})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
