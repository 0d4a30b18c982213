"""OPENVINO-SDPA-EMPTY-ROWS: OpenVINO's ScaledDotProductAttention-13 on the CPU plugin returns NaN for a
query row whose bool mask is all False in f32 and f16, and the mean of all values (masked ones
included) in bf16.

Needs only openvino and NumPy. Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
import sys

try:
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (round to nearest even)."""
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def run(et: ov.Type, q, k, v, keep) -> np.ndarray:
    params = [ops.parameter(list(x.shape), et) for x in (q, k, v)] + [ops.parameter(list(keep.shape), ov.Type.boolean)]
    node = ops.scaled_dot_product_attention(*params, causal=False)
    model = ov.Core().compile_model(ov.Model([node], params), "CPU")
    if et == ov.Type.bf16:
        inputs = []
        for x in (q, k, v):
            t = ov.Tensor(ov.Type.bf16, list(x.shape))
            t.data.view(np.uint16)[...] = to_bf16_bits(x)
            inputs.append(t)
        out = model.create_infer_request().infer(inputs + [ov.Tensor(keep)], share_inputs=False)[model.output(0)]
        return from_bf16_bits(np.asarray(out).view(np.uint16))
    dt = np.float32 if et == ov.Type.f32 else np.float16
    out = model.create_infer_request().infer([x.astype(dt) for x in (q, k, v)] + [keep], share_inputs=False)
    return np.asarray(out[model.output(0)], dtype=np.float32)


def main() -> int:
    core = ov.Core()
    print(f"openvino {ov.__version__}, CPU inference precision hint {core.get_property('CPU', 'INFERENCE_PRECISION_HINT')}")
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(1, 1, 3, 8)).astype(np.float32) for _ in range(3))
    v = np.concatenate([v, np.full((1, 1, 1, 8), 1000.0, np.float32)], axis=2)   # a 4th value, masked
    k = np.concatenate([k, rng.normal(size=(1, 1, 1, 8)).astype(np.float32)], axis=2)
    keep = np.ones((1, 1, 3, 4), dtype=bool)
    keep[..., 3] = False          # key 3 (value 1000) is masked for every query
    keep[0, 0, 1, :] = False      # query row 1 sees no key
    rows = {}
    for name, et in (("f32", ov.Type.f32), ("f16", ov.Type.f16), ("bf16", ov.Type.bf16)):
        out = run(et, q, k, v, keep)
        rows[name] = out[0, 0, 1]
        seen = np.abs(out[0, 0, [0, 2]]).max()
        print(f"{name:4s}: rows that see keys max |out| = {seen:.3g}; empty row out[:3] = {rows[name][:3]}")
    print(f"mean of all 4 values[:3] = {v[0, 0].mean(0)[:3]}")
    nan = np.isnan(rows["f32"]).all() and np.isnan(rows["f16"]).all()
    leak = np.all(np.abs(rows["bf16"]) > 100)
    if nan or leak:
        print(f"REPRODUCED: a fully-masked row is NaN in f32 and f16 ({nan}) and {rows['bf16'][0]:.4g} in bf16 "
              f"(the mean of all values, the masked 1000 included: {leak}); the spec asks 0")
        return 0
    print("NOT REPRODUCED: fully-masked rows are neither NaN nor the mean of all values")
    return 1


if __name__ == "__main__":
    sys.exit(main())
