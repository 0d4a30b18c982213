#!/usr/bin/env python3
"""ONNX-ORT-MHA-CAUSAL-CROSS: com.microsoft.MultiHeadAttention with unidirectional=1 and more keys than
queries lets the last query row see every key. Needs onnxruntime, onnx and NumPy only."""
import sys

try:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)

S, T, D = 3, 5, 8   # query rows, keys, head size; one head, no past


def session():
    node = helper.make_node("MultiHeadAttention", ["query", "key", "value"], ["output"], domain="com.microsoft",
                            num_heads=1, unidirectional=1)
    graph = helper.make_graph([node], "mha", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                                              for n in ("query", "key", "value")],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


rng = np.random.default_rng(0)
query = rng.normal(size=(1, S, D)).astype(np.float32)
key = rng.normal(size=(1, T, D)).astype(np.float32)
value = np.eye(T, D, dtype=np.float32)[None]          # one-hot values: output row i = attention weights of row i
weights = session().run(None, {"query": query, "key": key, "value": value})[0][0, :, :T]
seen = [[int(j) for j in np.nonzero(row > 0)[0]] for row in weights]
top_left = [list(range(i + 1)) for i in range(S)]                       # j <= i
bottom_right = [list(range(min(T, i + T - S + 1))) for i in range(S)]   # j <= i + T - S
print(f"onnxruntime {ort.__version__}: keys with nonzero weight per query row: {seen}")
print(f"top-left causal would be {top_left}; bottom-right causal would be {bottom_right}")
if seen not in (top_left, bottom_right):
    print(f"REPRODUCED: with {S} queries and {T} keys the last query row attends to keys {seen[-1]}, "
          f"rows before it are top-left ({seen[:-1]})")
    sys.exit(0)
print(f"NOT REPRODUCED: unidirectional is a consistent causal mask ({'top-left' if seen == top_left else 'bottom-right'})")
sys.exit(1)
