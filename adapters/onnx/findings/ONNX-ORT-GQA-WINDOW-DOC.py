#!/usr/bin/env python3
"""ONNX-ORT-GQA-WINDOW-DOC: GroupQueryAttention's `local_window_size` counts the current key, but its schema
calls it "left_window_size", the name ONNX Attention-25 gives to the number of keys *before* the current
one. Needs onnxruntime, onnx and NumPy only."""
import sys

try:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper
    from onnxruntime.capi import onnxruntime_pybind11_state as C
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)

F, I32 = TensorProto.FLOAT, TensorProto.INT32
S, D, W = 8, 8, 2


def run(local_window_size):
    node = helper.make_node("GroupQueryAttention", ["query", "key", "value", "", "", "seqlens_k", "total_sequence_length"],
                            ["output"], domain="com.microsoft", num_heads=1, kv_num_heads=1,
                            local_window_size=local_window_size)
    inputs = [helper.make_tensor_value_info(n, t, None) for n, t in
              (("query", F), ("key", F), ("value", F), ("seqlens_k", I32), ("total_sequence_length", I32))]
    graph = helper.make_graph([node], "gqa", inputs, [helper.make_tensor_value_info("output", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    q, k = (rng.normal(size=(1, S, D)).astype(np.float32) for _ in range(2))
    v = np.eye(S, D, dtype=np.float32)[None]      # one-hot values: output row = attention weights
    y = sess.run(None, {"query": q, "key": k, "value": v, "seqlens_k": np.array([S - 1], np.int32),
                        "total_sequence_length": np.array(S, np.int32)})[0]
    return [int(j) for j in np.nonzero(y[0, S - 1] > 0)[0]]


doc = next((a.description for x in C.get_all_operator_schema() if x.name == "GroupQueryAttention"
            for a in x.attributes.values() if a.name == "local_window_size"), "")
keys = run(W)
print(f"onnxruntime {ort.__version__}; schema text of local_window_size: {doc!r}")
print(f"local_window_size={W}: the last query (position {S - 1}) attends to keys {keys}")
print(f"ONNX Attention-25 left_window_size={W} would attend to {list(range(S - 1 - W, S))}")
if "left_window_size" in doc and keys == list(range(S - W, S)):
    print(f"REPRODUCED: local_window_size={W} attends to {W} keys including the current one, while the schema "
          f"calls it left_window_size (which means {W} keys before the current one)")
    sys.exit(0)
print("NOT REPRODUCED: the schema text and the behaviour agree")
sys.exit(1)
