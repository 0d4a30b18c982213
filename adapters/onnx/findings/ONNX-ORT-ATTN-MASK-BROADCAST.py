#!/usr/bin/env python3
"""ONNX-ORT-ATTN-MASK-BROADCAST: onnxruntime's CPU Attention (ai.onnx opset 23) rejects attn_mask shapes
that broadcast over the query axis, which the operator schema allows. Needs onnxruntime, onnx, NumPy."""
import sys

try:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)

B, H, S, T, D = 2, 2, 4, 6, 8


def session():
    node = helper.make_node("Attention", ["Q", "K", "V", "attn_mask"], ["Y"])
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "QKV"]
    inputs.append(helper.make_tensor_value_info("attn_mask", TensorProto.BOOL, None))
    graph = helper.make_graph([node], "attention", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.log_severity_level = 4               # the error comes back as an exception; do not also log it
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def expected(q, k, v, mask):
    logits = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(D)
    logits = np.where(np.broadcast_to(mask, logits.shape), logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bhij,bhjd->bhid", w / w.sum(-1, keepdims=True), v.astype(np.float64))


rng = np.random.default_rng(0)
q, k, v = (rng.normal(size=s).astype(np.float32) for s in ((B, H, S, D), (B, H, T, D), (B, H, T, D)))
sess = session()
broken = []
for shape in [(T,), (B, 1, 1, T), (S, T), (B, 1, S, T)]:
    mask = np.ones(shape, dtype=bool)
    mask[..., T - 1] = False                     # hide the last key everywhere
    try:
        y = sess.run(None, {"Q": q, "K": k, "V": v, "attn_mask": mask})[0]
    except Exception as exc:                      # onnxruntime raises Fail with its check in the message
        text = str(exc).split(" was false. ")[-1].strip()
        print(f"mask shape {shape}: raises: {text}")
        broken.append(shape)
        continue
    err = float(np.abs(y - expected(q, k, v, mask)).max())
    print(f"mask shape {shape}: runs, max error {err:.2e}")
    if err > 1e-5:
        broken.append(shape)
print(f"onnxruntime {ort.__version__}")
if broken:
    print(f"REPRODUCED: Attention rejects or miscomputes broadcastable attn_mask shapes {broken}")
    sys.exit(0)
print("NOT REPRODUCED: every broadcastable mask shape runs and matches the NumPy reference")
sys.exit(1)
