#!/usr/bin/env python3
"""ONNX-REF-SCALE-SQRT: onnx's reference evaluator multiplies Q and K by np.sqrt(scale) of the float32
attribute: a negative scale gives NaN outputs, and float64 inputs lose the scale's float64 accuracy
(the square root is taken in float32). Needs onnx and NumPy only (onnxruntime, if present, is shown too)."""
import sys

try:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)

S, T, D = 4, 6, 8


def model(elem, scale):
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], scale=scale)
    graph = helper.make_graph([node], "attention", [helper.make_tensor_value_info(n, elem, None) for n in "QKV"],
                              [helper.make_tensor_value_info("Y", elem, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 10
    return m


def exact(q, k, v, scale):
    logits = scale * np.einsum("bhid,bhjd->bhij", q, k)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bhij,bhjd->bhid", w / w.sum(-1, keepdims=True), v)


rng = np.random.default_rng(21)
q, k, v = (rng.normal(size=s) for s in ((1, 1, S, D), (1, 1, T, D), (1, 1, T, D)))
y = ReferenceEvaluator(model(TensorProto.FLOAT, -0.35)).run(None, {n: a.astype(np.float32) for n, a in zip("QKV", (q, k, v))})[0]
nan = int(np.isnan(y).sum())
print(f"float32, scale=-0.35: {nan} of {y.size} outputs NaN (exact result finite, max |y| {np.abs(exact(q, k, v, -0.35)).max():.3f})")
y64 = ReferenceEvaluator(model(TensorProto.DOUBLE, 0.5)).run(None, {"Q": q, "K": k, "V": v})[0]
err = float(np.abs(y64 - exact(q, k, v, 0.5)).max())
print(f"float64, scale=0.5 (exactly a float32): max error {err:.2e} (float64 rounding is ~1e-16)")
try:
    import onnxruntime as ort

    try:
        options = ort.SessionOptions()
        options.log_severity_level = 4
        ort.InferenceSession(model(TensorProto.FLOAT, -0.35).SerializeToString(), options, providers=["CPUExecutionProvider"])
        print(f"onnxruntime {ort.__version__}: accepts scale=-0.35")
    except Exception as exc:
        print(f"onnxruntime {ort.__version__}: refuses scale=-0.35: {str(exc).split(' was false. ')[-1].strip()}")
except ImportError:
    pass
print(f"onnx {onnx.__version__}")
if nan or err > 1e-12:
    print(f"REPRODUCED: negative scale -> {nan} NaN outputs; float64 with scale 0.5 errs by {err:.1e}")
    sys.exit(0)
print("NOT REPRODUCED: negative scales compute and float64 keeps the scale exact")
sys.exit(1)
