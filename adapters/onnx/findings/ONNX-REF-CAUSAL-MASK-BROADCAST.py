#!/usr/bin/env python3
"""ONNX-REF-CAUSAL-MASK-BROADCAST: onnx's reference evaluator builds Attention's causal frontier from the
attn_mask's shape, so a mask that broadcasts over the query axis gives every query row the frontier of
row 0 (and a rank-1 mask raises). Needs onnx and NumPy only."""
import sys

try:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)

S = T = 4
D = 8


def evaluator():
    node = helper.make_node("Attention", ["Q", "K", "V", "attn_mask"], ["Y"], is_causal=1)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "QKV"]
    inputs.append(helper.make_tensor_value_info("attn_mask", TensorProto.BOOL, None))
    graph = helper.make_graph([node], "attention", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    return ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]))


rng = np.random.default_rng(25)
q, k = (rng.normal(size=(1, 1, S, D)).astype(np.float32) for _ in range(2))
v = np.eye(T, D, dtype=np.float32)[None, None]       # one-hot values: output row = attention weights
ev = evaluator()
expected = [[j for j in range(i + 1) if j != 3] for i in range(S)]   # causal and "key 3 hidden"
found = []
for shape in [(1, 1, S, T), (1, 1, 1, T), (T,)]:
    mask = np.ones(shape, dtype=bool)
    mask[..., 3] = False
    try:
        y = ev.run(None, {"Q": q, "K": k, "V": v, "attn_mask": mask})[0]
    except Exception as exc:
        print(f"mask shape {shape}: raises {type(exc).__name__}: {exc}")
        found.append(shape)
        continue
    seen = [[int(j) for j in np.nonzero(row > 0)[0]] for row in y[0, 0, :, :T]]
    print(f"mask shape {shape}: keys with nonzero weight per row {seen}")
    if seen != expected:
        found.append(shape)
print(f"onnx {onnx.__version__}; expected (causal, key 3 hidden): {expected}")
if found:
    print(f"REPRODUCED: is_causal with a mask of shape {found[0]} is wrong (rows get row 0's causal frontier), "
          f"and shapes {found[1:]} too")
    sys.exit(0)
print("NOT REPRODUCED: every broadcastable mask composes with is_causal correctly")
sys.exit(1)
