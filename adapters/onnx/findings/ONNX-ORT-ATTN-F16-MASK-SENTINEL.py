#!/usr/bin/env python3
"""ONNX-ORT-ATTN-F16-MASK-SENTINEL: onnxruntime's float16 Attention masks by adding -65504 to the logit, so
a masked key with a large logit takes the row's weight (or turns it NaN). Needs onnxruntime, onnx, NumPy."""
import sys

try:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)

D = 16


def session():
    node = helper.make_node("Attention", ["Q", "K", "V", "attn_mask"], ["Y"])
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, None) for n in "QKV"]
    inputs.append(helper.make_tensor_value_info("attn_mask", TensorProto.BOOL, None))
    graph = helper.make_graph([node], "attention", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


rng = np.random.default_rng(24)
k = (0.1 * rng.normal(size=(1, 1, 4, D))).astype(np.float16)
k[0, 0, 0, 0] = 60000.0                          # key 0: huge, but masked
v = np.eye(4, D, dtype=np.float16)[None, None]  # one-hot values: output = weights
mask = np.ones((1, 1, 2, 4), dtype=bool)
mask[..., 0] = False                              # key 0 is hidden from both query rows
sess = session()
leaked = False
for q0 in (4.0, 8.0, 10.0):
    q = np.zeros((1, 1, 2, D), dtype=np.float16)
    q[..., 0] = q0                                # scaled logit of key 0 = q0 * 60000 / sqrt(16)
    y = sess.run(None, {"Q": q, "K": k, "V": v, "attn_mask": mask})[0].astype(np.float64)
    w = y[0, 0, 0, :4]
    print(f"hidden key's scaled logit {q0 * 15000:>8.0f}: weights of row 0 = {np.round(w, 4).tolist()}")
    leaked |= bool(np.isnan(w).any() or w[0] != 0)
print(f"onnxruntime {ort.__version__}; the weight of the masked key 0 must be exactly 0")
if leaked:
    print("REPRODUCED: a masked key with a float16 logit above ~65500 takes the row's weight (1.2e5) or makes it NaN (1.5e5)")
    sys.exit(0)
print("NOT REPRODUCED: the masked key gets weight 0 at every logit")
sys.exit(1)
