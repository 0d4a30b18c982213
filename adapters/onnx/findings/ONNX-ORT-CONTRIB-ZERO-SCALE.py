#!/usr/bin/env python3
"""ONNX-ORT-CONTRIB-ZERO-SCALE: onnxruntime's com.microsoft MultiHeadAttention reads scale = 0 as 'not
given' and uses 1/sqrt(head_size). With scale 0 every key weighs alike, so the exact output is the
mean of V. Needs onnx, onnxruntime and NumPy. Exit 0 (REPRODUCED) while the behaviour lasts, 1 once fixed."""
import sys

try:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)

S, T, H, D = 4, 6, 1, 8


def model(scale):
    node = helper.make_node("MultiHeadAttention", ["query", "key", "value"], ["output"], domain="com.microsoft",
                            num_heads=H, scale=scale)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("query", "key", "value")]
    graph = helper.make_graph([node], "mha", io, [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m


def exact(q, k, v, scale):
    logits = scale * q @ k.T
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


rng = np.random.default_rng(23)
q, k, v = rng.normal(size=(S, D)), rng.normal(size=(T, D)), rng.normal(size=(T, D))
feeds = {"query": q[None].astype(np.float32), "key": k[None].astype(np.float32), "value": v[None].astype(np.float32)}
sess = ort.InferenceSession(model(0.0).SerializeToString(), providers=["CPUExecutionProvider"])
y = sess.run(None, feeds)[0][0].astype(np.float64)
to_zero = float(np.abs(y - exact(q, k, v, 0.0)).max())
to_default = float(np.abs(y - exact(q, k, v, 1 / np.sqrt(D))).max())
what = (f"onnxruntime {ort.__version__}, MultiHeadAttention scale=0: error {to_zero:.3g} against scale 0 "
        f"(the mean of V), {to_default:.3g} against the default scale 1/sqrt({D})")
if to_zero > 1e-5 and to_default < 1e-5:
    print(f"REPRODUCED: {what}")
    sys.exit(0)
print(f"NOT REPRODUCED: {what}")
sys.exit(1)
