"""Quick checks of the torch adapters on CPU: agreement with the reference, honest
unsupported reasons, mask folding, recorded flags, the kernel wrapper, the MHA layer."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attnconf import adapters  # noqa: E402
from attnconf.conformance.engine import tolerance as T  # noqa: E402
from attnconf.reference import Case  # noqa: E402


def _case(seed=0, B=2, H=2, Hkv=None, Lq=5, Lk=7, D=8, **kw) -> Case:
    rng = np.random.default_rng(seed)
    Hkv = Hkv or H
    return Case.build(rng.normal(size=(B, H, Lq, D)), rng.normal(size=(B, Hkv, Lk, D)),
                      rng.normal(size=(B, Hkv, Lk, D)), grad_out=rng.normal(size=(B, H, Lq, D)), **kw)


@pytest.fixture(scope="module")
def impls():
    default = adapters.load("torch")          # torch:flex is opt-in (registry.py): load it by name
    return {a.name: a for a in (*default, *adapters.load("torch", impl="torch:flex"))}


CASES = {
    "plain": dict(),
    "mask": dict(mask=np.random.default_rng(5).random((2, 1, 5, 7)) > 0.3),
    "bias": dict(bias=np.random.default_rng(6).normal(size=(1, 2, 5, 7))),
    "causal_tl": dict(causal="top_left"),
    "causal_br_empty_rows": dict(causal="bottom_right", Lq=7, Lk=5),
    "padding": dict(q_lengths=[5, 2], kv_lengths=[7, 3]),
    "gqa": dict(H=4, Hkv=2),
}


@pytest.mark.parametrize("name", ["torch:sdpa-math", "torch:sdpa-flash", "torch:flex"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", list(CASES))
def test_cpu_impl_matches_reference(impls, name, dtype, kind):
    case = _case(dtype=dtype, **CASES[kind])
    a = impls[name]
    assert a.supports(case) is True
    res = a.run(case)
    assert res.out_dtype == dtype
    j = T.judge_output(res.out, case)
    assert j.ok, j.explain()
    if res.lse is not None:
        assert T.judge_lse(res.lse, case).ok


def test_gradients_match_reference(impls):
    case = _case(dtype="float32", bias=np.random.default_rng(1).normal(size=(5, 7)), causal="bottom_right")
    res = impls["torch:sdpa-math"].run(case, grads=True)
    assert set(res.grads) == {"dq", "dk", "dv", "dbias"} and res.grads["dbias"].shape == (5, 7)
    assert all(j.ok for j in T.judge_gradients(res.grads, case))


def test_kernel_recorded(impls):
    case = _case(dtype="float32")
    assert "flash_attention" in impls["torch:sdpa-flash"].run(case).kernel
    assert impls["torch:sdpa-math"].run(case).kernel.startswith("MATH")


def test_impossible_forced_path_is_unsupported(impls):
    case = _case(dtype="float32", bias=np.zeros((5, 7)))
    reason = impls["torch:sdpa-flash"].supports(case, need=frozenset({"grads", "dbias"}))
    assert isinstance(reason, str) and "lacks dbias" in reason
    rng = np.random.default_rng(0)
    dv = Case.build(rng.normal(size=(1, 1, 3, 8)), rng.normal(size=(1, 1, 4, 8)), rng.normal(size=(1, 1, 4, 4)))
    reason = impls["torch:sdpa-flash"].supports(dv)
    assert isinstance(reason, str) and "same last dimension" in reason


def test_broadcast_kv_needs_equal_batches(impls):
    case = _case(dtype="float32").replace(layout="broadcast_kv")
    assert "equal across the batch" in impls["torch:sdpa-math"].supports(case)
    c = _case(dtype="float32")
    ok = c.replace(k=np.repeat(c.k[:1], 2, 0), v=np.repeat(c.v[:1], 2, 0), layout="broadcast_kv")
    assert impls["torch:sdpa-math"].supports(ok) is True
    assert T.judge_output(impls["torch:sdpa-math"].run(ok).out, ok).ok


def test_fold_bottom_right_causal(impls):
    case = _case(dtype="float64", causal="bottom_right", Lq=7, Lk=5)
    args, kwargs, _ = impls["torch:sdpa-math"].arguments(case)
    assert kwargs["is_causal"] is False and kwargs["attn_mask"].dtype == torch.bool
    out = impls["torch:sdpa-math"].run(case).out
    assert (out[:, :, :2] == 0).all()  # rows 0 and 1 see no key when Lq - Lk = 2


def test_describe_records_flags():
    a = adapters.load("torch", impl="torch:sdpa-math")[0]
    d = a.describe()
    assert d["framework"] == "torch" and d["version"] == torch.__version__
    assert d["flags"]["cuda.matmul.allow_tf32"] is False and d["flags"]["float32_matmul_precision"] == "highest"
    d = adapters.load("torch", impl="torch:sdpa-math", options={"allow_tf32": True})[0].describe()
    assert d["flags"]["cuda.matmul.allow_tf32"] is True
    adapters.load("torch", impl="torch:sdpa-math")  # back to full precision for the other tests


def plain_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                                            is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


def test_kernel_adapter_wraps_plain_function():
    from attnconf.adapters.torch import kernel_adapter

    a = kernel_adapter(plain_sdpa, "cpu", "torch:kernel:plain_sdpa")
    case = _case(dtype="float16", causal="bottom_right", H=4, Hkv=2)
    res = a.run(case, grads=True)
    assert res.out_dtype == "float16" and T.judge_output(res.out, case).ok
    assert all(j.ok for j in T.judge_gradients(res.grads, case))


def test_mha_layer_matches_reference():
    layer = pytest.importorskip("attnconf.reference.layer")
    a = next(x for x in adapters.load("torch") if x.kind == "layer")
    rng = np.random.default_rng(3)
    for kw in (dict(mask="random"), dict(causal="top_left")):
        lc = layer.random_layer_case(rng, 2, 5, 5, 16, 4, dtype="float64", **kw)
        assert a.supports_layer(lc) is True
        assert np.abs(a.run_layer(lc) - layer.mha(lc)).max() < 1e-12


def test_cuda_paths_declare_only_what_their_kernels_take():
    """Measured on an H100 (torch 2.11): CUDA flash refuses every attn_mask and bottom-right causal,
    CUDA memory-efficient refuses enable_gqa, compiled flex on CUDA needs head dims >= 16. Declaring
    them made ATTN-SCOPE-1 fail on correct kernels (reports/gpu/h100-2026-11-24/NOTES.md)."""
    from attnconf.adapters.torch.flex import FlexAdapter
    from attnconf.adapters.torch.sdpa import SdpaEfficient, SdpaFlash

    cuda_flash, cpu_flash = SdpaFlash("cuda"), SdpaFlash("cpu")
    assert not {"mask", "bias", "q_lengths", "kv_lengths", "causal_bottom_right"} & cuda_flash.capabilities
    assert {"mask", "bias", "causal_bottom_right"} <= cpu_flash.capabilities and "dropout" not in cpu_flash.capabilities
    assert "dropout" in cuda_flash.capabilities and "gqa" in cuda_flash.capabilities
    assert "gqa" not in SdpaEfficient("cuda").capabilities
    rng = np.random.default_rng(0)
    small = Case.build(*(rng.standard_normal((1, 1, 4, 8)) for _ in range(3)), dtype="float16")
    assert "at least 16" in FlexAdapter("cuda").extra_support(small)
    assert FlexAdapter("cpu").extra_support(small) is True
