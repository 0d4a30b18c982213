#!/usr/bin/env python3
"""ONNX-REF-F16-HIDDEN-OVERFLOW: onnx's reference evaluator computes float16 logits before it masks them,
so a masked key whose float16 logit overflows turns its row NaN (+inf + -inf). Needs onnx and NumPy."""
import sys

try:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)

D = 16
node = helper.make_node("Attention", ["Q", "K", "V", "attn_mask"], ["Y"])
inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, None) for n in "QKV"]
inputs.append(helper.make_tensor_value_info("attn_mask", TensorProto.BOOL, None))
graph = helper.make_graph([node], "attention", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, None)])
ev = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]))
rng = np.random.default_rng(24)
k = (0.1 * rng.normal(size=(1, 1, 4, D))).astype(np.float16)
k[0, 0, 0, 0] = 60000.0                             # key 0: huge, and masked for every query
v = rng.normal(size=(1, 1, 4, D)).astype(np.float16)
mask = np.ones((1, 1, 2, 4), dtype=bool)
mask[..., 0] = False
bad = False
for q0 in (4.0, 6.0, 8.0):
    q = np.zeros((1, 1, 2, D), dtype=np.float16)
    q[..., 0] = q0
    y = ev.run(None, {"Q": q, "K": k, "V": v, "attn_mask": mask})[0]
    print(f"hidden key's scaled logit {q0 * 15000:>7.0f}: row 0 = {[round(float(x), 3) for x in y[0, 0, 0, :4]]} ...")
    bad |= bool(np.isnan(y).any())
print(f"onnx {onnx.__version__}; masked key 0 must not matter, the visible logits are all below 1")
if bad:
    print("REPRODUCED: a masked key whose float16 logit overflows (>= 65520) makes the row NaN")
    sys.exit(0)
print("NOT REPRODUCED: rows stay finite")
sys.exit(1)
