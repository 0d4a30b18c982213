"""Probe cases built so that the output reads off one quantity: the scale through two keys, and each
argument's effect (ATTN-ARG-1) through a case with the feature on strongly."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from attnconf.conformance.strategies.cells import dtype_choice, offer
from attnconf.conformance.strategies.sizes import head_dims
from attnconf.conformance.strategies.values import CUSTOM_SCALES, values
from attnconf.reference import DTYPES, Case


@st.composite
def two_key_cases(draw, *, dk=None, dtypes: tuple[str, ...] = DTYPES, custom_scale: bool = True) -> Case:
    """Lk = 2 with V rows e_0 and e_1 (or [1] and [0] when Dv = 1): out[i, 0] = sigmoid(scale * q_i.(k0 - k1)).

    Each query is built so that scale * q_i.(k0 - k1) lies in +-[0.5, 2.5], where the
    recovered scale is well conditioned."""
    d = draw(dk if dk is not None else st.sampled_from(head_dims()))
    dv = draw(st.sampled_from((d, d, 1, 2)))
    dtype = draw(dtype_choice(dtypes))
    hq, lq = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 3, 8)))
    scale = draw(st.sampled_from((None, None, None) + CUSTOM_SCALES)) if custom_scale else None
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    s = 1.0 / np.sqrt(d) if scale is None else scale
    k0 = rng.normal(size=(1, hq, 1, d))
    gap = rng.normal(size=(1, hq, 1, d))
    gap *= np.sqrt(d) / np.linalg.norm(gap, axis=-1, keepdims=True)       # |k0 - k1|^2 = Dk
    k = np.concatenate([k0, k0 - gap], axis=2)
    z = rng.uniform(0.5, 2.5, size=(1, hq, lq, 1)) * rng.choice((-1.0, 1.0), size=(1, hq, lq, 1))
    noise = rng.normal(size=(1, hq, lq, d))
    noise -= (noise * gap).sum(-1, keepdims=True) * gap / d                 # orthogonal to the gap
    q = z / (s * d) * gap + noise
    v = np.zeros((1, hq, 2, dv))
    v[:, :, 0, 0] = 1.0
    if dv > 1:
        v[:, :, 1, 1] = 1.0
    return Case.build(q, k, v, dtype=dtype, seed=seed, scale=scale)


PROBE_FEATURES = ("window", "softcap", "alibi", "sinks", "mask", "bias", "causal", "dropout", "scale", "kv_lengths")


@st.composite
def probe_cases(draw, feature: str, *, dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16", "float64")) -> Case:
    """A small plain case with `feature` turned on strongly enough that ignoring it moves the output by
    far more than any tolerance (ATTN-ARG-1); see `probe_case`."""
    hkv = draw(st.sampled_from((1, 2)))
    lq = draw(st.sampled_from((4, 7, 9, 16)))
    return probe_case(feature, seed=draw(st.integers(0, 2**32 - 1)), dtype=draw(dtype_choice(dtypes)),
                      b=draw(st.sampled_from((1, 2))), hkv=hkv, hq=hkv * draw(st.sampled_from((1, 2))), lq=lq,
                      lk=draw(st.sampled_from((lq, lq, 5, 13, 17))), d=draw(st.sampled_from((8, 16))),
                      window=(draw(st.sampled_from((0, 1, 2))), draw(st.sampled_from((0, 1, -1)))),
                      align=draw(st.sampled_from(("bottom_right", "top_left"))),
                      softcap=draw(st.sampled_from((0.5, 1.0))), causal=draw(st.sampled_from(("bottom_right", "top_left"))))


def probe_case(feature: str, *, seed: int = 0, dtype: str = "float32", b: int = 1, hkv: int = 1, hq: int = 2,
               lq: int = 7, lk: int = 7, d: int = 16, window: tuple[int, int] = (1, 0), align: str = "bottom_right",
               softcap: float = 1.0, causal: str = "bottom_right") -> Case:
    """A window of a few keys, softcap 1 on logits ~ 10, ALiBi slopes ~ 1, a sink logit of 5, a mask
    hiding half the keys (no empty row), a bias ~ 3, causal, dropout 0.5 on one-hot V, a scale 4x the
    default, the first sequence's keys padded to half: the feature on; the plain case is the same with it off."""
    rng = np.random.default_rng(seed)
    s = {"B": b, "Hq": hq, "Hkv": hkv, "Lq": lq, "Lk": lk, "Dk": d, "Dv": d}
    q, k, v = values(rng, s, "ordinary", dtype)
    p: dict = {}
    if feature == "window":
        p["window"], p["window_align"] = window, align
    elif feature == "softcap":
        q = q * 4.0                                  # logits of about +-10 against a cap of 1
        p["softcap"] = softcap
    elif feature == "alibi":
        p["alibi_slopes"] = rng.uniform(0.5, 2.0, size=hq).astype(np.float32).astype(np.float64)
    elif feature == "sinks":
        offer("sinks")
        p["sinks"] = np.full(hq, 5.0)
    elif feature == "mask":
        m = rng.random((b, 1, lq, lk)) < 0.5
        m[..., 0] = True                             # no empty rows: the effect is the mask's alone
        p["mask"] = m
    elif feature == "bias":
        p["bias"] = 3.0 * rng.normal(size=(b, hq, lq, lk))
    elif feature == "causal":
        p["causal"] = causal
    elif feature == "dropout":
        v = np.broadcast_to(np.eye(lk)[None, None], (b, hkv, lk, lk)).copy()
        q, k = 0.5 * q, 0.5 * k
        p["dropout_p"] = 0.5
    elif feature == "scale":
        p["scale"] = 4.0 / np.sqrt(d)
    elif feature == "kv_lengths":
        p["kv_lengths"] = np.array([max(1, lk // 2), lk])[:b]        # the first sequence shorter than the next
    else:
        raise ValueError(f"no probe for {feature!r}")
    return Case.build(q, k, v, dtype=dtype, seed=seed, regime="ordinary", **p)
