"""The `onnx` backend: ONNX attention operators run by ONNX Runtime (CPU) and by onnx's reference evaluator.

Implementations (each its own adapter, so a result names the kernel that produced it):

- `onnx:ort-attention`: the standard `Attention` operator (opset 23; 24 when `nonpad_kv_seqlen`
  is used; 25 when a window is) on ONNX Runtime's CPU execution provider;
- `onnx:ort-gqa`: `com.microsoft.GroupQueryAttention`, ONNX Runtime's LLM-inference kernel, with
  its default dispatch (its tiled "flash" path where it applies: no attention_bias, softcap or
  head_sink);
- `onnx:ort-gqa-unfused`: the same operator with `ORT_GQA_DISABLE_FLASH_ATTENTION=1` set while
  its sessions are built (the kernel reads it once, in its constructor), which forces the
  materialising path;
- `onnx:ort-mha`: `com.microsoft.MultiHeadAttention` (float32 only on CPU);
- `onnx:reference`: `onnx.reference.ReferenceEvaluator` running the same `Attention` graph.

How a Case becomes each node is in `adapters/onnx/graphs.py`. Each adapter builds one graph per
signature (operator, opset, element types, optional inputs present, attribute values) with
symbolic shapes and caches the session: `describe()` reports how many were built, how many calls
reused one and how long building took. Sessions run single-threaded (`intra_op_num_threads=1`):
the suite's cases are small, and the machine is shared.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from typing import Any, Iterator, Literal

import numpy as np

import onnx

from attnconf.reference import Case
from attnconf.spec.vocabulary import DTYPES

from attnconf.adapters.base import Adapter, KernelError, NotSupported, Result
from attnconf.adapters.onnx.graphs import (ELEM, GraphCache, Inexpressible, OpCall, attention_call, batch_element, from_bsd, gqa_call,
                          gqa_needs_split, mha_call, np_array, to_bsd)

FRAMEWORK = "onnx"
INSTALL_HINT = "pip install onnx onnxruntime"
DEVICES = ("cpu",)

ORT_AVAILABLE = importlib.util.find_spec("onnxruntime") is not None

_STANDARD = frozenset({"mask", "bias", "causal_top_left", "causal_bottom_right", "q_lengths", "kv_lengths", "gqa",
                       "custom_scale", "dv_ne_dk", "cross", "mask_with_causal", "window_top_left",
                       "window_bottom_right", "softcap"})


def _one_line(exc: BaseException) -> str:
    """The informative line of an onnxruntime / onnx error."""
    text = str(exc).strip()
    m = re.search(r"Status Message: (.*)", text)
    if m:
        text = m.group(1)
    else:
        text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : [A-Z_]+ : ", "", text)
    m = re.search(r" was false\. (.*)", text)        # ORT_ENFORCE: keep the message, drop the C++ signature
    if m:
        text = m.group(1)
    text = re.sub(r"^Exception during initialization: ", "", text)
    return text.splitlines()[0][:300] if text else type(exc).__name__


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of a session build, then restore them."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class OnnxAdapter(Adapter):
    """What the ONNX implementations share: a Case -> OpCall mapping, a graph cache, conversion back."""

    backend = "onnx"
    kind = "sdpa"
    devices = ("cpu",)
    runtime = ""

    def __init__(self, device: str = "cpu"):
        super().__init__(device)
        self.cache = GraphCache()

    # -- to be provided by subclasses -------------------------------------
    def call_for(self, case: Case) -> OpCall:
        raise NotImplementedError

    def build(self, call: OpCall) -> Any:
        raise NotImplementedError

    def execute(self, obj: Any, call: OpCall) -> list[np.ndarray]:
        raise NotImplementedError

    def kernel_name(self, call: OpCall) -> str:
        dom = f"{call.domain}." if call.domain else ""
        return f"{dom}{call.op} (opset {call.opset}) on {self.runtime}"

    # -- the Adapter interface ---------------------------------------------
    def extra_support(self, case: Case) -> Literal[True] | str:
        try:
            self.call_for(case)
        except Inexpressible as exc:
            return f"{self.name}: {exc}"
        return True

    def run(self, case: Case, *, grads: bool = False) -> Result:
        if grads:
            raise NotSupported(f"{self.name} has no backward pass (an inference runtime)")
        try:
            call = self.call_for(case)
        except Inexpressible as exc:
            raise NotSupported(f"{self.name}: {exc}") from None
        outs = self._run_call(call)
        y = outs[0]
        out = np.asarray(call.unpack(np.asarray(y)), dtype=np.float64)
        res = Result(out=out, out_dtype=_dtype_name(y), kernel=self.kernel_name(call),
                     notes={"folds": call.notes} if call.notes else {})
        if len(outs) > 1 and call.outputs[-1][0] == "qk_matmul_output":
            res.weights = np.asarray(outs[-1], dtype=np.float64)
        return res

    def _run_call(self, call: OpCall) -> list[np.ndarray]:
        try:
            obj = self.cache.get(call.signature(), lambda: self.build(call))
        except Exception as exc:
            raise KernelError(f"{self.name} could not build the {call.op} graph: {_one_line(exc)}") from exc
        try:
            return self.execute(obj, call)
        except Exception as exc:
            raise KernelError(f"{self.name} raised {type(exc).__name__}: {_one_line(exc)}") from exc

    def describe(self) -> dict[str, Any]:
        d = {**super().describe(), "framework": "onnx", "version": onnx.__version__, "onnx": onnx.__version__,
             "runtime": self.runtime, **self.cache.stats()}
        if ORT_AVAILABLE:
            import onnxruntime  # noqa: PLC0415

            d["onnxruntime"] = onnxruntime.__version__
        return d


# ---- ONNX Runtime ---------------------------------------------------------
class OrtAdapter(OnnxAdapter):
    """An operator on ONNX Runtime's CPU execution provider."""

    runtime = "onnxruntime CPUExecutionProvider"
    environment: dict[str, str] = {}

    def build(self, call: OpCall) -> Any:
        import onnxruntime as ort  # noqa: PLC0415

        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.log_severity_level = 4   # errors come back as exceptions; do not also print them to stderr
        with _environment(self.environment):
            return ort.InferenceSession(call.model().SerializeToString(), so, providers=["CPUExecutionProvider"])

    def execute(self, sess: Any, call: OpCall) -> list[np.ndarray]:
        names = [n for n, _ in call.outputs if n]
        return sess.run(names, {k: v for k, v in call.feeds.items()})

    def describe(self) -> dict[str, Any]:
        import onnxruntime as ort  # noqa: PLC0415

        return {**super().describe(), "framework": "onnxruntime", "version": ort.__version__,
                "providers": ["CPUExecutionProvider"], "intra_op_num_threads": 1,
                "graph_optimization_level": "ORT_ENABLE_ALL (default)",
                "session_environment": dict(self.environment), "ort_build": ort.get_build_info()}


class OrtAttentionAdapter(OrtAdapter):
    name = "onnx:ort-attention"
    # The CPU kernel is registered for float and MLFloat16. For float64 onnxruntime has no kernel and
    # inlines the operator's ONNX function body instead (MatMul, Softmax, ... in double), which runs;
    # for bfloat16 the body needs an Expand(13) kernel it lacks ("Could not find an implementation").
    dtypes = ("float64", "float32", "float16")
    capabilities = _STANDARD

    def call_for(self, case: Case) -> OpCall:
        return attention_call(case)

    def kernel_name(self, call: OpCall) -> str:
        name = super().kernel_name(call)
        if call.inputs[0][1] == "float64":
            return f"{name}: no float64 kernel, the operator's function body inlined by onnxruntime"
        return f"{name}: CPU kernel Attention<{'MLFloat16' if call.inputs[0][1] == 'float16' else 'float'}>"

    def run_raw(self, q, k, v, dtype):
        return self._run_call(_raw_attention(q, k, v, dtype))[0]


class OrtGqaAdapter(OrtAdapter):
    name = "onnx:ort-gqa"
    dtypes = ("float32", "float16")
    # Bottom-right only: the new chunk is the last Lq keys, query s at position kv_len - Lq + s. (A top-left
    # case maps only where its offset coincides, Lq = kv_len; gqa_call accepts those, but the declaration
    # keeps generation on the operator's own convention.)
    capabilities = frozenset({"mask", "bias", "causal_bottom_right", "kv_lengths", "gqa", "custom_scale", "cross",
                              "mask_with_causal", "window_bottom_right", "softcap", "sinks"})

    # The operator runs only cases whose key lengths cover the queries (kv_len >= Lq: the new chunk is the
    # last Lq keys), which the suite's strategies cannot be told; at budget 1.0 a ci run left 16 of its
    # (clause, dtype) cells below the coverage floor of 3 checked examples (onnx 1.23.2 / ORT 1.32.0, 108
    # of its unsupported draws were kv_len < Lq). Twice the draws cost about 7 s of CPU per GQA adapter.
    example_budget = 2.0

    def scope(self) -> dict[str, Any]:
        """The CPU kernel requires head_size % 8 == 0 ("head_size must be a multiple of 8"); the new chunk is
        the last Lq keys, so the keys must cover the queries (Lk >= Lq, kv_lengths >= Lq)."""
        return {"head_dims": tuple(range(8, 257, 8)), "kv_covers_q": True}

    def call_for(self, case: Case) -> OpCall:
        if gqa_needs_split(case):
            calls = [gqa_call(batch_element(case, b)) for b in range(case.shape["B"])]
            calls[0].notes.append("one batch element per call (a non-causal chunk after a cache needs batch 1)")
            return calls[0]
        return gqa_call(case)

    def run(self, case: Case, *, grads: bool = False) -> Result:
        if grads or not gqa_needs_split(case):
            return super().run(case, grads=grads)
        parts = [super(OrtGqaAdapter, self).run(batch_element(case, b)) for b in range(case.shape["B"])]
        res = parts[0]
        res.out = np.concatenate([p.out for p in parts], axis=0)
        res.notes["folds"] = res.notes.get("folds", []) + ["one batch element per call (a non-causal chunk after "
                                                           "a cache needs batch 1)"]
        return res

    def kernel_name(self, call: OpCall) -> str:
        # The tiled path's documented conditions (onnxruntime docs for the CPU GQA kernel): no attention_bias,
        # softcap, smooth softmax or head_sink, total_sequence_length > 1; the binary exports it for float
        # (ApplyAttentionFlash(const float*, ...)). Which path ran is inferred from these, not observed.
        flash_eligible = ("attention_bias" not in call.feeds and "softcap" not in call.attrs
                          and "head_sink" not in call.feeds and int(call.feeds["total_sequence_length"]) > 1
                          and call.inputs[0][1] == "float32")
        if self.environment:
            path = "unfused path (ORT_GQA_DISABLE_FLASH_ATTENTION=1)"
        else:
            path = "tiled flash path by its documented conditions" if flash_eligible else "unfused path"
        return f"{super().kernel_name(call)}, {path}"

    def run_raw(self, q, k, v, dtype):
        q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
        feeds = {"query": np_array(to_bsd(q), dtype), "key": np_array(to_bsd(k), dtype),
                 "value": np_array(to_bsd(v), dtype),
                 "seqlens_k": np.full(k.shape[0], k.shape[2] - 1, np.int32),
                 "total_sequence_length": np.array(k.shape[2], np.int32)}
        call = OpCall("GroupQueryAttention", "com.microsoft", 21,
                      [("query", dtype), ("key", dtype), ("value", dtype), ("", None), ("", None),
                       ("seqlens_k", "int32"), ("total_sequence_length", "int32")],
                      feeds, {"num_heads": q.shape[1], "kv_num_heads": k.shape[1]}, [("output", dtype)],
                      unpack=lambda y: y)
        return from_bsd(self._run_call(call)[0], q.shape[1])


class OrtGqaUnfusedAdapter(OrtGqaAdapter):
    name = "onnx:ort-gqa-unfused"
    environment = {"ORT_GQA_DISABLE_FLASH_ATTENTION": "1"}


class OrtMhaAdapter(OrtAdapter):
    name = "onnx:ort-mha"
    # The CPU kernel is registered for float only; for float16 onnxruntime's graph transformers insert
    # Casts around it (float16 in, float32 kernel, float16 out), which runs. bfloat16 has no kernel.
    dtypes = ("float32", "float16")
    capabilities = frozenset({"mask", "bias", "causal_top_left", "causal_bottom_right", "q_lengths", "kv_lengths",
                              "custom_scale", "dv_ne_dk", "cross", "mask_with_causal"})

    def call_for(self, case: Case) -> OpCall:
        return mha_call(case)

    def kernel_name(self, call: OpCall) -> str:
        name = super().kernel_name(call)
        if call.inputs[0][1] == "float16":
            return f"{name}: float kernel between Casts that onnxruntime inserts (no float16 CPU kernel)"
        return name

    def run_raw(self, q, k, v, dtype):
        q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
        feeds = {"query": np_array(to_bsd(q), dtype), "key": np_array(to_bsd(k), dtype),
                 "value": np_array(to_bsd(v), dtype)}
        call = OpCall("MultiHeadAttention", "com.microsoft", 21, [("query", dtype), ("key", dtype), ("value", dtype)],
                      feeds, {"num_heads": q.shape[1]}, [("output", dtype)], unpack=lambda y: y)
        return from_bsd(self._run_call(call)[0], q.shape[1])


# ---- onnx's reference evaluator --------------------------------------------
class ReferenceEvaluatorAdapter(OnnxAdapter):
    """`onnx.reference.ReferenceEvaluator` on the standard Attention graph (NumPy, in the input dtype)."""

    name = "onnx:reference"
    runtime = "onnx.reference.ReferenceEvaluator"
    dtypes = DTYPES
    capabilities = _STANDARD | {"weights"}

    def call_for(self, case: Case) -> OpCall:
        return attention_call(case, weights=True)

    def build(self, call: OpCall) -> Any:
        from onnx.reference import ReferenceEvaluator  # noqa: PLC0415

        return ReferenceEvaluator(call.model())

    def execute(self, ev: Any, call: OpCall) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            return ev.run(None, dict(call.feeds))

    def run(self, case: Case, *, grads: bool = False) -> Result:
        res = super().run(case, grads=grads)
        if case.dtype == "bfloat16" and res.out_dtype != "bfloat16":
            res.notes["returned_dtype"] = res.out_dtype
        return res

    def run_raw(self, q, k, v, dtype):
        return self._run_call(_raw_attention(q, k, v, dtype))[0]


def _raw_attention(q, k, v, dtype: str) -> OpCall:
    """A plain Attention call on arbitrary (possibly invalid) 4-D arrays."""
    feeds = {"Q": np_array(q, dtype), "K": np_array(k, dtype), "V": np_array(v, dtype)}
    return OpCall("Attention", "", 23, [("Q", dtype), ("K", dtype), ("V", dtype)], feeds, {}, [("Y", dtype)],
                  unpack=lambda y: y)


def _dtype_name(y: np.ndarray) -> str:
    name = np.asarray(y).dtype.name
    return {"float32": "float32", "float16": "float16", "float64": "float64", "bfloat16": "bfloat16"}.get(name, name)


IMPLEMENTATIONS: tuple[type[OnnxAdapter], ...] = (OrtAttentionAdapter, OrtGqaAdapter, OrtGqaUnfusedAdapter,
                                                   OrtMhaAdapter, ReferenceEvaluatorAdapter)


def implementations(device: str, options: dict[str, Any]) -> list[Adapter]:
    """Every implementation on the CPU; the ONNX Runtime ones only where onnxruntime is installed."""
    return [cls(device) for cls in IMPLEMENTATIONS
            if ORT_AVAILABLE or not issubclass(cls, OrtAdapter)]


__all__ = ["DEVICES", "ELEM", "FRAMEWORK", "IMPLEMENTATIONS", "INSTALL_HINT", "implementations"]
