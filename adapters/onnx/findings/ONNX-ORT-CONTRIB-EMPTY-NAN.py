#!/usr/bin/env python3
"""ONNX-ORT-CONTRIB-EMPTY-NAN: com.microsoft GroupQueryAttention and MultiHeadAttention return NaN for a
query row whose keys are all masked (ONNX's own Attention returns 0 there). Needs onnxruntime, onnx, NumPy."""
import sys

try:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)

F, I32 = TensorProto.FLOAT, TensorProto.INT32
S, D = 4, 8


def session(op, inputs, attrs):
    """One com.microsoft node; inputs are (name, element type) in positional order, "" for an absent one."""
    node = helper.make_node(op, [n for n, _ in inputs], ["output"], domain="com.microsoft", **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info(n, t, None) for n, t in inputs if n],
                              [helper.make_tensor_value_info("output", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


rng = np.random.default_rng(1)
q, k, v = (rng.normal(size=(1, S, D)).astype(np.float32) for _ in range(3))
bias = np.zeros((1, 1, S, S), dtype=np.float32)
bias[..., 1, :] = -np.inf                         # query row 1 may see no key
results = {}

gqa = session("GroupQueryAttention",
              [("query", F), ("key", F), ("value", F), ("", 0), ("", 0), ("seqlens_k", I32),
               ("total_sequence_length", I32), ("", 0), ("", 0), ("", 0), ("attention_bias", F)],
              {"num_heads": 1, "kv_num_heads": 1, "causal": 0})
y = gqa.run(None, {"query": q, "key": k, "value": v, "seqlens_k": np.array([S - 1], np.int32),
                   "total_sequence_length": np.array(S, np.int32), "attention_bias": bias})[0]
results["GroupQueryAttention, attention_bias row of -inf"] = y[0, 1]

mha = session("MultiHeadAttention", [("query", F), ("key", F), ("value", F), ("", 0), ("", 0), ("attention_bias", F)],
              {"num_heads": 1})
y = mha.run(None, {"query": q, "key": k, "value": v, "attention_bias": bias})[0]
results["MultiHeadAttention, attention_bias row of -inf"] = y[0, 1]

mha_pad = session("MultiHeadAttention", [("query", F), ("key", F), ("value", F), ("", 0), ("key_padding_mask", I32)],
                  {"num_heads": 1})
y = mha_pad.run(None, {"query": q, "key": k, "value": v, "key_padding_mask": np.array([0], np.int32)})[0]
unmasked = mha.run(None, {"query": q, "key": k, "value": v, "attention_bias": np.zeros_like(bias)})[0]
results["MultiHeadAttention, key_padding_mask length 0 (default mask_filter_value)"] = y[0, 1]
print(f"onnxruntime {ort.__version__}; a row that sees no key must output 0 (ONNX Attention: 'a zero output row, not NaN')")
for label, row in results.items():
    print(f"  {label}: {[round(float(x), 4) for x in row[:4]]} ...")
same = float(np.abs(y - unmasked).max())
print(f"  (the key_padding_mask length-0 output is the unmasked output up to {same:.2e}: every key got -10000)")
nan = [label for label, row in results.items() if np.isnan(row).any()]
if nan:
    print(f"REPRODUCED: NaN on a fully masked row from {', '.join(l.split(',')[0] for l in nan)}")
    sys.exit(0)
print("NOT REPRODUCED: fully masked rows are finite")
sys.exit(1)
