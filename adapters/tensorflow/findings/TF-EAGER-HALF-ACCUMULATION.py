"""TF-EAGER-HALF-ACCUMULATION: on CPU, eager tf.einsum accumulates float16 contractions in float16
(error grows with the contraction length), while tf.matmul, tf.linalg.matmul (BatchMatMulV2) and
tf.tensordot of the same operands accumulate in float32. keras.ops.dot_product_attention computes
both of its products with tf.einsum, so its eager float16 result is about 10x less accurate than
its XLA-compiled one. bfloat16 shows the same when oneDNN does not take it (see the .md).

Needs only tensorflow and NumPy. Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
try:
    import numpy as np
    import tensorflow as tf
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def ulp(x: np.ndarray, dtype) -> np.ndarray:
    """Spacing of the half type at |x| (float16 from NumPy; bfloat16 has 8 significant bits)."""
    if dtype == tf.float16:
        return np.spacing(np.abs(x).astype(np.float16)).astype(np.float64)
    exponent = np.floor(np.log2(np.maximum(np.abs(x), 2.0 ** -126)))
    return 2.0 ** (exponent - 7)


def errors_in_ulps(dtype, inner: int, bound: int, seed: int) -> dict[str, tuple[float, int]]:
    """Integer operands: every product and every partial sum is an integer below 2**24, so a
    float32 accumulator is exact and the only error left is the final rounding to the half type
    (<= 1 ulp). Errors above 1 ulp mean partial sums were rounded to the half type."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-bound, bound + 1, size=(16, inner)).astype(np.float64)
    b = rng.integers(-bound, bound + 1, size=(inner, 64)).astype(np.float64)
    exact = a @ b
    assert np.abs(exact).max() < 60000, "operands chosen so that no result overflows float16"
    ta, tb = tf.cast(tf.constant(a), dtype), tf.cast(tf.constant(b), dtype)
    results = {
        "tf.einsum('ij,jk->ik')": tf.einsum("ij,jk->ik", ta, tb),
        "tf.einsum('btnh,bsnh->bnts')": tf.reshape(tf.einsum(
            "btnh,bsnh->bnts", tf.reshape(ta, (1, 16, 1, inner)),
            tf.reshape(tf.transpose(tb), (1, 64, 1, inner))), (16, 64)),
        "tf.matmul": tf.matmul(ta, tb),
        "tf.linalg.matmul 3-D (BatchMatMulV2)": tf.matmul(ta[None], tb[None])[0],
        "tf.tensordot": tf.tensordot(ta, tb, 1),
    }
    out = {}
    for name, value in results.items():
        err = np.abs(tf.cast(value, tf.float64).numpy() - exact) / ulp(exact, dtype)
        out[name] = (float(err.max()), int((err > 1).sum()))
    return out


def main() -> int:
    flags = cpu_flags()
    onednn_half = ("avx512bw" in flags and ({"avx512_fp16", "amx_fp16"} & flags)) or "avx_ne_convert" in flags
    onednn_bf16 = "avx512f" in flags or "avx_ne_convert" in flags
    onednn_env = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "(unset: on)")
    print(f"tensorflow {tf.__version__}; TF_ENABLE_ONEDNN_OPTS={onednn_env}; CPU flags: "
          f"avx512f={'avx512f' in flags} avx512bw={'avx512bw' in flags} "
          f"avx512_fp16={'avx512_fp16' in flags} amx_fp16={'amx_fp16' in flags} "
          f"avx_ne_convert={'avx_ne_convert' in flags}")
    print(f"oneDNN takes float16 on this CPU: {bool(onednn_half)}; bfloat16: {bool(onednn_bf16)} "
          "(tensorflow/core/util/util.cc IsDataTypeSupportedByOneDNNOnThisCPU)")
    verdict = {}
    for dtype, bound in ((tf.float16, 20), (tf.bfloat16, 15)):
        for inner in (64, 512):
            res = errors_in_ulps(dtype, inner, bound, seed=inner)
            print(f"{dtype.name} K={inner} (max error in ulps, elements > 1 ulp of 1024): "
                  + "; ".join(f"{n} {e:.1f} ({c})" for n, (e, c) in res.items()))
            verdict.setdefault(dtype.name, []).append(res)
    f16 = verdict["float16"]
    einsum_bad = any(r["tf.einsum('ij,jk->ik')"][1] > 0 for r in f16)
    matmul_ok = all(r["tf.matmul"][1] == 0 for r in f16)
    bf16_bad = any(r["tf.einsum('ij,jk->ik')"][1] > 0 for r in verdict["bfloat16"])
    print(f"bfloat16 tf.einsum accumulates in bfloat16 here: {bf16_bad}")
    if einsum_bad:
        worst = max(r["tf.einsum('ij,jk->ik')"][0] for r in f16)
        print(f"REPRODUCED: eager tf.einsum accumulates float16 in float16 on this CPU (up to {worst:.0f} ulp "
              f"where float32 accumulation is exact to 1 ulp); tf.matmul is within 1 ulp: {matmul_ok}")
        return 0
    if onednn_half and onednn_env != "0":
        print("CANNOT RUN: this CPU has the features with which TensorFlow sends float16 contractions to "
              "oneDNN (which accumulates in float32); the Eigen path this finding is about is not reached here")
        return 2
    print("NOT REPRODUCED: eager tf.einsum float16 is within 1 ulp of a float32-accumulated result")
    return 1


if __name__ == "__main__":
    sys.exit(main())
