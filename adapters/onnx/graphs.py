"""ONNX graphs for attention: how a Case becomes one node of a one-node model, and the graph cache.

Three operators are mapped here, each exactly as its documentation defines it:

- the standard `Attention` (ai.onnx, opset 23; opset 24 adds the `nonpad_kv_seqlen` input and the
  offset-aware causal frontier of an external cache; opset 25 adds `left_window_size` and
  `right_window_size`). Schema text: `onnx.defs.get_schema("Attention", 25).doc`, reference
  implementation `onnx/reference/ops/op_attention.py` (onnx 1.23.2);
- `com.microsoft.GroupQueryAttention` and `com.microsoft.MultiHeadAttention` (ONNX Runtime contrib
  operators, docs/ContribOperators.md; the same schema text is what
  `onnxruntime.capi.onnxruntime_pybind11_state.get_all_operator_schema()` returns).

A mapping returns an `OpCall`: the node's inputs in positional order, its attributes, the NumPy
feeds and a function that turns the primary output back into the spec's (B, Hq, Lq, Dv) layout.
Graphs are keyed by `OpCall.signature()` (operator, opset, element types, which optional inputs
are present, attribute values, requested outputs): shapes are left symbolic, so one session
serves every shape of a signature. What an operator cannot express natively is folded into its
mask input with the reference's visibility rules (as adapters/sdpa_convention.py does for SDPA),
and the fold is listed in `OpCall.notes`; a case that an operator cannot express at all raises
`Inexpressible` with the reason, which the adapters turn into an unsupported record.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from attnconf.reference import Case, numpy_dtype
from attnconf.reference.attention import causal_visible, window_visible

# onnx.TensorProto element types, spelled out so that this module imports without onnx
ELEM = {"float32": 1, "float16": 10, "float64": 11, "bfloat16": 16, "bool": 9, "int32": 6, "int64": 7}
MS_DOMAIN = "com.microsoft"


class Inexpressible(Exception):
    """The operator has no way to say this case (one-line reason)."""


@dataclass
class OpCall:
    op: str
    domain: str
    opset: int
    inputs: list[tuple[str, str | None]]          # positional (name, element type); ("", None) = absent
    feeds: dict[str, np.ndarray]
    attrs: dict[str, Any]
    outputs: list[tuple[str, str]]                # (name, element type); the first is the result
    unpack: Callable[[np.ndarray], np.ndarray]    # primary output -> (B, Hq, Lq, Dv)
    notes: list[str] = field(default_factory=list)

    def signature(self) -> tuple:
        inputs = list(self.inputs)
        while inputs and inputs[-1][0] == "":
            inputs.pop()
        return (self.op, self.domain, self.opset, tuple(inputs), tuple(sorted(self.attrs.items())),
                tuple(self.outputs))

    def model(self):
        """The one-node ModelProto of this call (symbolic shapes)."""
        from onnx import helper  # noqa: PLC0415

        inputs = [n for n, _ in self.inputs]
        while inputs and inputs[-1] == "":
            inputs.pop()
        node = helper.make_node(self.op, inputs, [n for n, _ in self.outputs],
                                domain=self.domain or None, **self.attrs)
        graph = helper.make_graph(
            [node], f"attnconf_{self.op}",
            [helper.make_tensor_value_info(n, ELEM[t], None) for n, t in self.inputs if n],
            [helper.make_tensor_value_info(n, ELEM[t], None) for n, t in self.outputs if n])
        imports = [helper.make_opsetid("", self.opset)]
        if self.domain:
            imports.append(helper.make_opsetid(self.domain, 1))
        model = helper.make_model(graph, opset_imports=imports, producer_name="attnconf")
        model.ir_version = 10   # onnxruntime 1.32 reads IR <= 11; 10 is what onnx 1.16+ writes for opset 21+
        return model


class GraphCache:
    """Objects (sessions, evaluators) built once per signature, with the cost of building them."""

    def __init__(self) -> None:
        self.items: dict[tuple, Any] = {}
        self.built = 0
        self.hits = 0
        self.build_seconds = 0.0

    def get(self, key: tuple, make: Callable[[], Any]) -> Any:
        if key in self.items:
            self.hits += 1
            return self.items[key]
        t0 = time.perf_counter()
        obj = make()          # an exception here is not cached: the next call retries (and raises again)
        self.build_seconds += time.perf_counter() - t0
        self.built += 1
        self.items[key] = obj
        return obj

    def stats(self) -> dict[str, Any]:
        return {"graphs_built": self.built, "cache_hits": self.hits,
                "build_seconds": round(self.build_seconds, 4)}


# ---- shared helpers -------------------------------------------------------
def np_array(x: np.ndarray, dtype: str) -> np.ndarray:
    """A C-contiguous array of `dtype` holding x (exact: case inputs are already rounded to dtype)."""
    return np.ascontiguousarray(np.asarray(x, dtype=np.float64).astype(numpy_dtype(dtype)))


def to_bsd(x: np.ndarray) -> np.ndarray:
    """(B, H, L, D) -> (B, L, H*D), the 3-D layout of the contrib operators."""
    b, h, length, d = x.shape
    return np.ascontiguousarray(np.transpose(x, (0, 2, 1, 3)).reshape(b, length, h * d))


def from_bsd(y: np.ndarray, heads: int) -> np.ndarray:
    """(B, L, H*D) -> (B, H, L, D)."""
    b, length, hd = y.shape
    return np.transpose(y.reshape(b, length, heads, hd // heads), (0, 2, 1, 3))


def lengths(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """Per-batch (q_len, kv_len), the full lengths where the case gives none."""
    s = case.shape
    ql = np.full(s["B"], s["Lq"]) if case.q_lengths is None else case.q_lengths.astype(np.int64)
    kl = np.full(s["B"], s["Lk"]) if case.kv_lengths is None else case.kv_lengths.astype(np.int64)
    return ql, kl


def spec_offset(case: Case, align: str) -> np.ndarray:
    """Per-batch diagonal offset the spec uses: 0 top-left, kv_len - q_len bottom-right (ATTN-CAUSAL-1)."""
    ql, kl = lengths(case)
    return np.zeros_like(ql) if align == "top_left" else kl - ql


def fold_visibility(case: Case, *, causal: bool, window: bool, q_rows: bool, kv_cols: bool) -> np.ndarray | None:
    """(B, 1, Lq, Lk) bool: the parts of visibility chosen for folding into a mask, or None if it hides nothing."""
    s = case.shape
    B, Lq, Lk = s["B"], s["Lq"], s["Lk"]
    ql, kl = lengths(case)
    vis = np.ones((B, 1, Lq, Lk), dtype=bool)
    for b in range(B):
        qb = None if case.q_lengths is None else int(ql[b])
        kb = None if case.kv_lengths is None else int(kl[b])
        if causal and case.causal is not None:
            vis[b, 0] &= causal_visible(Lq, Lk, case.causal, qb, kb)
        if window and case.window is not None:
            vis[b, 0] &= window_visible(Lq, Lk, case.window, case.window_align, qb, kb)
        if q_rows and case.q_lengths is not None:
            vis[b, 0, int(ql[b]):, :] = False
        if kv_cols and case.kv_lengths is not None:
            vis[b, 0, :, int(kl[b]):] = False
    return None if vis.all() else vis


def combine_masks(case: Case, fold: np.ndarray | None, *, as_float: bool = False) -> np.ndarray | None:
    """The case's mask and bias with a folded visibility, as one mask input.

    bool (True = attend) when there is no bias and `as_float` is false; otherwise float64 with the
    bias where visible and -inf where hidden (ATTN-MASK-2: a False entry is a -inf bias). The
    case's own shapes are kept when nothing is folded, so the kernel's broadcasting is exercised.
    """
    mask, bias = case.mask, case.bias
    if fold is not None:
        mask = fold if mask is None else np.logical_and(mask, fold)
    if bias is None and not as_float:
        return mask
    if mask is None:
        return bias
    if bias is None:
        return np.where(mask, 0.0, -np.inf)
    return np.where(mask, bias, -np.inf)


def full_bias(m: np.ndarray | None, case: Case, *, heads_ok: bool = True) -> np.ndarray | None:
    """A float mask broadcast to (B or 1, Hq or 1, Lq, Lk): the shape the contrib operators accept."""
    if m is None:
        return None
    s = case.shape
    m = np.asarray(m, dtype=np.float64)
    m4 = m.reshape((1,) * (4 - m.ndim) + m.shape)
    b = s["B"] if m4.shape[0] > 1 else 1
    h = s["Hq"] if (m4.shape[1] > 1 or not heads_ok) else 1
    return np.ascontiguousarray(np.broadcast_to(m4, (b, h, s["Lq"], s["Lk"])))


# ---- the standard Attention operator -------------------------------------
def attention_call(case: Case, *, weights: bool = False, kv_route: str = "auto") -> OpCall:
    """`Attention` (opset 23/24/25) for `case`, 4-D inputs (B, H, L, D).

    Native: GQA/MQA (Hq a multiple of Hkv), Dv != Dk, `scale`, `softcap` (applied to the scaled
    logits before the mask, as the schema's diagram and ATTN-CAP order it), a bool or float
    `attn_mask` of any broadcastable shape, `is_causal`, `nonpad_kv_seqlen` (opset 24) and the
    window attributes (opset 25).

    Alignment. The schema's causal frontier and window are centred on `p = offset + i` where
    `offset` is 0 with no cache, `past_sequence_length` with `past_key`, and
    `nonpad_kv_seqlen[b] - q_sequence_length` with `nonpad_kv_seqlen` (opset 24 errata, onnx 1.23).
    A causal or window constraint of the case goes to the operator when that offset equals the
    spec's for its alignment in every batch element, and is folded into the mask otherwise.
    Bottom-right features without padding use `past_key`/`past_value` (the first Lk - Lq keys as
    the cache) when Lk > Lq and `kv_route` allows it, and `nonpad_kv_seqlen = Lk` otherwise.
    `q_lengths` has no input: padded query rows are folded into the mask (they then see no key).
    """
    s = case.shape
    B, Lq, Lk = s["B"], s["Lq"], s["Lk"]
    t = case.dtype
    ql, kl = lengths(case)
    notes: list[str] = []
    attrs: dict[str, Any] = {}
    if case.scale is not None:
        attrs["scale"] = float(case.scale)
    if case.softcap is not None:
        attrs["softcap"] = float(case.softcap)

    features = []  # (name, alignment) of the constraints that depend on a diagonal offset
    if case.causal is not None:
        features.append(("causal", case.causal))
    if case.window is not None:
        features.append(("window", case.window_align))
    wants_br = any(a == "bottom_right" and not np.array_equal(spec_offset(case, a), np.zeros(B)) for _, a in features)

    # Choose how keys are presented: plain, with nonpad_kv_seqlen, or with a past cache.
    route = "plain"
    if case.kv_lengths is not None:
        route = "nonpad"
    elif wants_br and case.q_lengths is None:
        route = "past" if (Lk > Lq and kv_route in ("auto", "past")) else "nonpad"
    if route == "past":
        native = np.full(B, Lk - Lq)
    elif route == "nonpad":
        native = kl - Lq
    else:
        native = np.zeros(B, dtype=np.int64)
    fold_causal = fold_window = False
    for name, align in features:
        if not np.array_equal(spec_offset(case, align), native):
            if name == "causal":
                fold_causal = True
            else:
                fold_window = True
            notes.append(f"{name} ({align}) folded into attn_mask: the operator's offset here is "
                         f"{native.tolist()}, the spec's {spec_offset(case, align).tolist()}")
    if case.causal is not None and not fold_causal:
        attrs["is_causal"] = 1
    if case.window is not None and not fold_window:
        attrs["left_window_size"], attrs["right_window_size"] = int(case.window[0]), int(case.window[1])
    if case.q_lengths is not None:
        notes.append("q_lengths folded into attn_mask (padded query rows see no key)")
    fold = fold_visibility(case, causal=fold_causal, window=fold_window, q_rows=True, kv_cols=False)
    mask = combine_masks(case, fold)
    if mask is not None and mask.shape[-1] != Lk:
        # The schema pads a last dimension shorter than total_sequence_length with -inf instead of
        # broadcasting it; the spec broadcasts (ATTN-MASK-1), so a size-1 key axis is expanded here.
        mask = np.broadcast_to(mask, mask.shape[:-1] + (Lk,))
        notes.append("mask broadcast along the key axis (the schema would pad it with -inf)")

    opset = 23
    if route == "nonpad":
        opset = 24
    if "left_window_size" in attrs:
        opset = 25
    feeds: dict[str, np.ndarray] = {}
    q, k, v = case.q, case.k, case.v
    inputs: list[tuple[str, str | None]] = [("Q", t), ("K", t), ("V", t)]
    outputs: list[tuple[str, str]] = [("Y", t)]
    if route == "past":
        P = Lk - Lq
        feeds["past_key"], feeds["past_value"] = np_array(k[:, :, :P], t), np_array(v[:, :, :P], t)
        k, v = k[:, :, P:], v[:, :, P:]
        notes.append(f"keys 0..{P - 1} passed as past_key/past_value (offset = past_sequence_length = {P})")
        outputs += [("present_key", t), ("present_value", t)]   # onnxruntime requires them with past_key
    feeds["Q"], feeds["K"], feeds["V"] = np_array(q, t), np_array(k, t), np_array(v, t)
    if mask is not None:
        if mask.dtype == bool:
            feeds["attn_mask"] = np.ascontiguousarray(mask)
            inputs.append(("attn_mask", "bool"))
        else:
            feeds["attn_mask"] = np_array(mask, t)
            inputs.append(("attn_mask", t))
    else:
        inputs.append(("", None))
    if route == "past":
        inputs += [("past_key", t), ("past_value", t)]
    else:
        inputs += [("", None), ("", None)]
    if route == "nonpad":
        feeds["nonpad_kv_seqlen"] = kl.astype(np.int64)
        inputs.append(("nonpad_kv_seqlen", "int64"))
    if weights:   # the post-softmax probabilities are the 4th output (mode 3); absent outputs are ""
        attrs["qk_matmul_output_mode"] = 3
        while len(outputs) < 3:
            outputs.append(("", t))
        outputs.append(("qk_matmul_output", t))
    return OpCall("Attention", "", opset, inputs, feeds, attrs, outputs, unpack=lambda y: y, notes=notes)


# ---- com.microsoft.GroupQueryAttention -----------------------------------
def gqa_call(case: Case) -> OpCall:
    """`GroupQueryAttention` (com.microsoft) for `case`.

    The operator takes query (B, S, Hq*D) and the new key/value chunk (B, S, Hkv*D) of the same
    length S = Lq, appended to a BNSH cache `past_key`/`past_value`; `seqlens_k[b] + 1` is the
    number of keys after the step and query row s sits at absolute position
    `seqlens_k[b] + 1 - S + s` (ContribOperators.md, "Right-padded query chunks"). So K/V rows
    kv_len[b] - Lq .. kv_len[b] - 1 of batch element b are the chunk and the rows before them the
    cache: the alignment is bottom-right, with `kv_len >= Lq` in every batch element.

    `causal=1` is the causal frontier; `local_window_size = left + 1` is the window: since
    microsoft/onnxruntime#25927 (ORT 1.23) the count includes the current key, although the
    schema still calls it "left_window_size" (see adapters/onnx/findings/ONNX-ORT-GQA-WINDOW-DOC.md).
    A bool mask and a bias become `attention_bias` (B or 1, Hq or 1, Lq, Lk), False as -inf
    (ATTN-MASK-2). `softcap`, `scale` and `head_sink` (the sinks) are native.
    """
    s = case.shape
    B, Hq, Hkv, Lq, Lk, D = s["B"], s["Hq"], s["Hkv"], s["Lq"], s["Lk"], s["Dk"]
    t = case.dtype
    ql, kl = lengths(case)
    if s["Dv"] != D:
        raise Inexpressible("GroupQueryAttention needs value head size = key head size")
    if D % 8:
        raise Inexpressible(f"GroupQueryAttention on CPU needs head_size a multiple of 8; got {D}")
    if case.q_lengths is not None:
        raise Inexpressible("GroupQueryAttention leaves padded query rows unspecified (query_seqlens); "
                            "there is no way to ask for the spec's zero rows")
    if (kl < Lq).any():
        raise Inexpressible(f"GroupQueryAttention needs kv_len >= Lq (the new chunk is the last Lq keys); "
                            f"kv_len {kl.tolist()}, Lq {Lq}")
    native = kl - Lq
    for name, align in (("causal", case.causal), ("window", case.window_align if case.window else None)):
        if align is not None and not np.array_equal(spec_offset(case, align), native):
            raise Inexpressible(f"GroupQueryAttention aligns {name} at offset kv_len - Lq = {native.tolist()}; "
                                f"the case's {align} offset is {spec_offset(case, align).tolist()}")
    causal, local = 0, -1
    if case.window is not None:
        left, right = case.window
        bounded_right = right >= 0 or case.causal is not None
        if not bounded_right:
            raise Inexpressible("GroupQueryAttention windows are causal (local_window_size needs causal=1); "
                                f"window {case.window} without causal is unbounded on the right")
        if right > 0 and case.causal is None:
            raise Inexpressible(f"GroupQueryAttention windows have no keys right of the diagonal; window {case.window}")
        causal = 1
        local = -1 if left < 0 else left + 1
    if case.causal is not None:
        causal = 1
    attrs: dict[str, Any] = {"num_heads": Hq, "kv_num_heads": Hkv, "causal": causal, "local_window_size": local}
    if case.scale is not None:
        attrs["scale"] = float(case.scale)
    if case.softcap is not None:
        attrs["softcap"] = float(case.softcap)

    # Per batch element: the last Lq valid keys are the new chunk, the ones before them the cache.
    P = int(native.max()) if B else 0
    k_new = np.stack([case.k[b, :, kl[b] - Lq:kl[b]] for b in range(B)])
    v_new = np.stack([case.v[b, :, kl[b] - Lq:kl[b]] for b in range(B)])
    feeds: dict[str, np.ndarray] = {"query": np_array(to_bsd(case.q), t), "key": np_array(to_bsd(k_new), t),
                                    "value": np_array(to_bsd(v_new), t)}
    inputs: list[tuple[str, str | None]] = [("query", t), ("key", t), ("value", t)]
    outputs: list[tuple[str, str]] = [("output", t)]
    notes: list[str] = []
    if P > 0:
        pk = np.zeros((B, Hkv, P, D))
        pv = np.zeros((B, Hkv, P, D))
        for b in range(B):
            pk[b, :, :native[b]] = case.k[b, :, :native[b]]
            pv[b, :, :native[b]] = case.v[b, :, :native[b]]
        feeds["past_key"], feeds["past_value"] = np_array(pk, t), np_array(pv, t)
        inputs += [("past_key", t), ("past_value", t)]
        outputs += [("present_key", t), ("present_value", t)]
        notes.append(f"keys before the last Lq valid ones passed as past_key/past_value (past lengths {native.tolist()})")
    else:
        inputs += [("", None), ("", None)]
    feeds["seqlens_k"] = (kl - 1).astype(np.int32)
    feeds["total_sequence_length"] = np.array(int(kl.max()), dtype=np.int32)
    optional: dict[str, str] = {"seqlens_k": "int32", "total_sequence_length": "int32"}
    m = combine_masks(case, None, as_float=True)
    if m is not None:
        # attention_bias columns are absolute key positions 0 .. total_sequence_length - 1
        feeds["attention_bias"] = np_array(full_bias(m, case)[..., :int(kl.max())], t)
        optional["attention_bias"] = t
        if case.mask is not None:
            notes.append("bool mask passed as attention_bias (False = -inf)")
    if case.sinks is not None:
        feeds["head_sink"] = np_array(case.sinks, t)
        optional["head_sink"] = t
    if P > 0 and B > 1 and Lq > 1:
        # "Without query_seqlens ... sequence_length > 1 requires batch_size == 1" with past context;
        # query_seqlens = S says every row of the chunk is valid, and requires causal=1. Without causal
        # the adapter runs one batch element per call (gqa_needs_split).
        if not causal:
            raise Inexpressible("GroupQueryAttention runs a batched multi-token chunk after a cache only with "
                                "query_seqlens, which requires causal=1 (run one batch element per call)")
        feeds["query_seqlens"] = np.full(B, Lq, dtype=np.int32)
        optional["query_seqlens"] = "int32"
    order = ["seqlens_k", "total_sequence_length", "cos_cache", "sin_cache", "position_ids", "attention_bias",
             "head_sink", "k_scale", "v_scale", "q_norm_weight", "k_norm_weight", "query_seqlens"]
    last = max(i for i, n in enumerate(order) if n in optional)
    inputs += [(n, optional[n]) if n in optional else ("", None) for n in order[:last + 1]]
    return OpCall("GroupQueryAttention", MS_DOMAIN, 21, inputs, feeds, attrs, outputs,
                  unpack=lambda y: from_bsd(y, Hq), notes=notes)


# ---- com.microsoft.MultiHeadAttention ------------------------------------
def mha_call(case: Case) -> OpCall:
    """`MultiHeadAttention` (com.microsoft) for `case`: query (B, Lq, H*Dk), key (B, Lk, H*Dk),
    value (B, Lk, H*Dv), no projection bias.

    `unidirectional=1` is the causal mask. Padding lengths go to `key_padding_mask` of shape (B,)
    ("the actual length of each key sequence excluding paddings"). A bool mask and a bias become
    `attention_bias` (B or 1, H or 1, Lq, Lk), False as -inf (ATTN-MASK-2); q_lengths are folded
    into it. No GQA (one head count), no window, no softcap.
    """
    s = case.shape
    B, H, Lq, Lk = s["B"], s["Hq"], s["Lq"], s["Lk"]
    t = case.dtype
    if s["Hkv"] != H:
        raise Inexpressible("MultiHeadAttention has one head count for query, key and value")
    notes: list[str] = []
    # mask_filter_value is what a padded key's logit receives. Its default, -10000, is not masking: a row
    # whose keys are all padded then gets the unmasked softmax (measured, onnxruntime 1.32), and a hidden
    # logit 1e4 above the visible ones leaks. -inf makes key_padding_mask exact (ATTN-MASK-2).
    attrs: dict[str, Any] = {"num_heads": H, "mask_filter_value": float("-inf")}
    if case.scale is not None:
        attrs["scale"] = float(case.scale)
    fold_causal = False
    if case.causal is not None:
        if np.array_equal(spec_offset(case, case.causal), np.zeros(B)):
            attrs["unidirectional"] = 1
        else:
            fold_causal = True
            notes.append(f"causal ({case.causal}) folded into attention_bias: unidirectional is top-left")
    fold = fold_visibility(case, causal=fold_causal, window=False, q_rows=True, kv_cols=False)
    if case.q_lengths is not None:
        notes.append("q_lengths folded into attention_bias (padded query rows see no key)")
    feeds: dict[str, np.ndarray] = {"query": np_array(to_bsd(case.q), t), "key": np_array(to_bsd(case.k), t),
                                    "value": np_array(to_bsd(case.v), t)}
    inputs: list[tuple[str, str | None]] = [("query", t), ("key", t), ("value", t), ("", None)]
    if case.kv_lengths is not None:
        feeds["key_padding_mask"] = case.kv_lengths.astype(np.int32)
        inputs.append(("key_padding_mask", "int32"))
    else:
        inputs.append(("", None))
    m = combine_masks(case, fold, as_float=True)
    if m is not None:
        feeds["attention_bias"] = np_array(full_bias(m, case), t)
        inputs.append(("attention_bias", t))
    return OpCall("MultiHeadAttention", MS_DOMAIN, 21, inputs, feeds, attrs, [("output", t)],
                  unpack=lambda y: from_bsd(y, H), notes=notes)


def gqa_needs_split(case: Case) -> bool:
    """A non-causal multi-token chunk after a cache with B > 1: GroupQueryAttention takes it one batch
    element at a time (its documented restriction without query_seqlens, which needs causal=1)."""
    s = case.shape
    ql, kl = lengths(case)
    causal = case.causal is not None or case.window is not None
    return s["B"] > 1 and s["Lq"] > 1 and not causal and int((kl - s["Lq"]).max(initial=0)) > 0


def batch_element(case: Case, b: int) -> Case:
    """Batch element b of `case` as a case of its own (masks and bias broadcast first, then sliced)."""
    s = case.shape
    full = (s["B"], s["Hq"], s["Lq"], s["Lk"])

    def pick(a):
        return None if a is None else np.broadcast_to(a, full)[b:b + 1]

    changes: dict[str, Any] = {"q": case.q[b:b + 1], "k": case.k[b:b + 1], "v": case.v[b:b + 1],
                               "mask": pick(case.mask), "bias": pick(case.bias)}
    for name in ("q_lengths", "kv_lengths"):
        arr = getattr(case, name)
        changes[name] = None if arr is None else arr[b:b + 1]
    if case.grad_out is not None:
        changes["grad_out"] = case.grad_out[b:b + 1]
    if case.alibi_slopes is not None and case.alibi_slopes.ndim == 2:
        changes["alibi_slopes"] = case.alibi_slopes[b:b + 1]
    return case.replace(**changes)
