#!/usr/bin/env python3
"""ONNX-ORT-ATTN-F16-SOFTCAP-OVERFLOW: onnxruntime's float16 Attention turns every row NaN when the
softcap attribute is 65520 or more (a cap that rounds to +inf in float16). Needs onnxruntime, onnx, NumPy."""
import sys

try:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


def session(dtype, softcap: float):
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], softcap=softcap)
    inputs = [helper.make_tensor_value_info(n, dtype, None) for n in "QKV"]
    graph = helper.make_graph([node], "attention", inputs, [helper.make_tensor_value_info("Y", dtype, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


rng = np.random.default_rng(31)
q, k, v = (rng.normal(size=(1, 2, 4, 8)) for _ in range(3))


def attend(dtype, np_dtype, softcap):
    feeds = {"Q": q.astype(np_dtype), "K": k.astype(np_dtype), "V": v.astype(np_dtype)}
    return session(dtype, softcap).run(None, feeds)[0].astype(np.float64)


uncapped = attend(TensorProto.FLOAT, np.float32, 0.0)
nan_at = []
for cap in (60000.0, 65504.0, 65519.0, 65520.0, 1e6):
    y = attend(TensorProto.FLOAT16, np.float16, cap)
    n = int(np.isnan(y).sum())
    err = float(np.nanmax(np.abs(y - uncapped))) if n < y.size else float("nan")
    print(f"float16, softcap {cap:>9.0f}: {n:>2} of {y.size} outputs NaN, max |y - uncapped float32| = {err:.2g}")
    if n:
        nan_at.append(cap)
y32 = attend(TensorProto.FLOAT, np.float32, 1e30)
print(f"float32, softcap 1e30: {int(np.isnan(y32).sum())} NaN")
print(f"onnxruntime {ort.__version__}; logits here are below 10, so any cap far above them must change nothing")
if nan_at and min(nan_at) >= 65520.0:
    print("REPRODUCED: float16 Attention with softcap >= 65520 outputs NaN; 65519 and below match the uncapped result")
    sys.exit(0)
print("NOT REPRODUCED: every cap gave finite outputs" if not nan_at else f"OTHER: NaN at caps {nan_at}")
sys.exit(1)
