"""The bug catalogue: the suite must fail every planted bug and pass both correct kernels.

Two layers. The fast tests check the catalogue itself against the float64
reference: the correct kernels agree with it, and every buggy kernel differs
from it on a witness case built for its defect (so a bug the suite misses is
the suite's gap, not a dud bug). The slow tests run the real suite on each
kernel in a subprocess (`pytest conformance --backend=torch --kernel=... -x`)
and record which test caught the bug, after how many examples and seconds.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from attnconf.spec.vocabulary import ALIGNMENTS, DTYPES

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="the bug catalogue is written in torch, which is not installed")

if importlib.util.find_spec("torch") is not None:
    from attnconf import adapters
    from bench.runner import run_suite
    from attnconf.reference import Case, naive_forward, oracle
    from tests.kernels import buggy

    BUGS = sorted(buggy.BUGS)
else:  # collected but skipped
    BUGS = []

CORRECT = ["naive", "tiled"]
ROOT = Path(__file__).resolve().parent.parent
EPS = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def run_kernel(module: str, name: str, case: "Case") -> np.ndarray:
    """The kernel's output through the real torch kernel adapter (the suite's own path)."""
    adapter = adapters.load("torch", kernel=f"tests.kernels.{module}:{name}")[0]
    return adapter.run(case).out


def random_case(seed: int = 0, *, B=2, Hq=4, Hkv=2, Lq=13, Lk=37, Dk=8, Dv=8, dtype="float32", kind=None,
                **params) -> "Case":
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s) for s in ((B, Hq, Lq, Dk), (B, Hkv, Lk, Dk), (B, Hkv, Lk, Dv)))
    if kind == "bool":
        params["mask"] = rng.random((B, 1, Lq, Lk)) < 0.7
    elif kind == "bias":
        params["bias"] = rng.standard_normal((B, Hq, Lq, Lk))
    return Case.build(q, k, v, dtype=dtype, **params)


# ---- the catalogue against the reference (fast) ---------------------------------
@pytest.mark.parametrize("name", CORRECT)
@pytest.mark.parametrize("dtype", DTYPES)
def test_correct_kernel_matches_reference(name, dtype):
    rng = np.random.default_rng(1)
    for i in range(12):
        B, Hkv = int(rng.integers(1, 3)), int(rng.integers(1, 3))
        Hq, Lq, Lk = Hkv * int(rng.integers(1, 3)), int(rng.integers(1, 40)), int(rng.integers(1, 60))
        params = {}
        if i % 3 == 0:
            params["mask"] = rng.random((B, 1, Lq, Lk)) < 0.5
        elif i % 3 == 1:
            params["bias"] = np.where(rng.random((B, Hq, Lq, Lk)) < 0.2, -np.inf, rng.standard_normal((B, Hq, Lq, Lk)))
        params["causal"] = (None, *ALIGNMENTS)[i % 3]
        if i % 4 == 0:
            params["kv_lengths"] = rng.integers(0, Lk + 1, B)
        case = random_case(i, B=B, Hq=Hq, Hkv=Hkv, Lq=Lq, Lk=Lk, Dk=int(rng.integers(1, 17)),
                           Dv=int(rng.integers(1, 17)), dtype=dtype, **params)
        if i % 4 == 3 and dtype == "float64":  # large logits: the max must be over visible keys only
            case = case.replace(q=case.q * 30, k=case.k * 30)
        ref = oracle(case).out
        err = np.abs(run_kernel("correct", name, case) - ref).max()
        if dtype == "float64":
            assert err < 1e-12, case.summary()
        else:
            base = np.abs(naive_forward(case)[0] - ref).max()
            assert err <= 2 * base + 2 * EPS[dtype] * np.abs(case.v).max(), case.summary()


def _fully_masked_row() -> "Case":
    case = random_case(kind="bool")
    mask = case.mask.copy()
    mask[0, 0, 3] = False
    return case.replace(mask=mask)


def _rising_max() -> "Case":
    case = random_case(Lk=40)
    k = case.k.copy()
    k[:, :, 20:] *= 6  # a later key block raises the row max
    return case.replace(k=k)


def _wide(case: "Case") -> "Case":
    """The case with Dk = Dv = 32 x its own (Q, K, V tiled along the head dim): past the 128 of a wide-head path."""
    return case.replace(q=np.tile(case.q, 32), k=np.tile(case.k, 32), v=np.tile(case.v, 32))


WITNESSES = {
    "no_scale": lambda: random_case(),
    "scale_twice": lambda: random_case(),
    "scale_sqrt_dv": lambda: random_case(Dv=4),
    "custom_scale_ignored": lambda: random_case(scale=0.9),
    "softmax_wrong_axis": lambda: random_case(),
    "no_max_subtraction": lambda: random_case().replace(q=random_case().q * 40, k=random_case().k * 40),
    "low_precision_accumulation": lambda: random_case(B=1, Hq=1, Hkv=1, Lq=8, Lk=1024, dtype="float16"),
    "denominator_includes_masked": lambda: random_case(kind="bool"),
    "inverted_bool_mask": lambda: random_case(kind="bool"),
    "float_mask_ignored": lambda: random_case(kind="bias"),
    "mask_multiplies_logits": lambda: random_case(kind="bool"),
    "batch0_mask": lambda: random_case(kind="bool"),
    "mask_wrong_axis": lambda: random_case(Lq=37, mask=np.random.default_rng(0).random((2, 1, 1, 37)) < 0.6),
    "query_length_off_by_one": lambda: random_case(q_lengths=np.array([13, 5])),
    "causal_strict": lambda: random_case(Lq=37, causal="top_left"),
    "causal_bottom_right": lambda: random_case(causal="top_left"),
    "empty_row_nan": _fully_masked_row,
    "empty_row_mean": _fully_masked_row,
    "gqa_tile": lambda: random_case(Hq=4, Hkv=2),
    "heads_transposed": lambda: random_case(),
    "online_no_rescale": _rising_max,
    "drops_partial_block": lambda: random_case(Lk=37),
    "reads_inputs_as_contiguous": lambda: random_case().replace(layout="noncontiguous"),
    "gqa_kv_head_mod4": lambda: random_case(B=1, Hq=16, Hkv=8),
    "split_kv_merge_without_sums": lambda: random_case(B=1, Hq=2, Hkv=1, Lq=4, Lk=1024),
    "wide_head_no_rescale": lambda: _wide(_rising_max()),
    "scale_zero_means_default": lambda: random_case(scale=0.0),
    "bf16_output_through_fp16": lambda: random_case(dtype="bfloat16").replace(v=random_case().v * 1e5),
    "mask3d_as_batch": lambda: random_case(B=2, Hq=2, mask=np.random.default_rng(5).random((2, 13, 37)) < 0.5),
    "scale_split_sqrt_abs": lambda: random_case(scale=-0.5),
    "causal_query_block_512": lambda: random_case(B=1, Hq=1, Hkv=1, Lq=530, Lk=530, causal="top_left"),
    "mask_batch_chunks_of_4": lambda: random_case(B=5, Hq=1, Hkv=1,
                                                  mask=np.random.default_rng(6).random((5, 1, 13, 37)) < 0.5),
}
# bugs whose forward output is right: each shows elsewhere
MUTATION_WITNESSES = {"mask_scaled_in_place": lambda: random_case(kind="bias")}
GRADIENT_WITNESSES = {
    "dq_from_last_key_block": lambda: random_case(B=1, Hq=2, Hkv=1, Lq=5, Lk=257, dtype="float64",
                                                  grad_out=np.random.default_rng(3).standard_normal((1, 2, 5, 8))),
}


@pytest.mark.parametrize("name", [b for b in BUGS if b in WITNESSES])
def test_bug_differs_from_reference_on_its_witness(name):
    case = WITNESSES[name]()
    ref = oracle(case).out
    with np.errstate(invalid="ignore"):
        err = np.abs(run_kernel("buggy", name, case) - ref)
    worst = np.inf if not np.isfinite(err).all() else err.max()
    if case.dtype == "float64":
        allowed = 1e-10
    else:  # well beyond the suite's 2 x baseline + floor
        allowed = 4 * np.abs(naive_forward(case)[0] - ref).max() + 4 * EPS[case.dtype] * np.abs(ref).max()
    assert worst > allowed


@pytest.mark.parametrize("name", sorted(MUTATION_WITNESSES))
def test_mutating_bug_is_refused_by_the_adapter(name):
    """The output is right; the adapter sees the caller's argument change (ATTN-OP-8)."""
    from attnconf.adapters import ConventionViolation

    case = MUTATION_WITNESSES[name]()
    assert np.abs(run_kernel("correct", "naive", case) - oracle(case).out).max() < 1e-5
    with pytest.raises(ConventionViolation) as info:
        run_kernel("buggy", name, case)
    assert info.value.clause == "ATTN-OP-8"


@pytest.mark.parametrize("name", sorted(GRADIENT_WITNESSES))
def test_gradient_bug_differs_from_reference_backward(name):
    from attnconf.reference import backward

    case = GRADIENT_WITNESSES[name]()
    adapter = adapters.load("torch", kernel=f"tests.kernels.buggy:{name}")[0]
    res = adapter.run(case, grads=True)
    ref = backward(case)
    assert np.abs(res.out - oracle(case).out).max() < 1e-12          # the forward is right
    assert np.abs(res.grads["dk"] - ref.dk).max() < 1e-10
    assert np.abs(res.grads["dq"] - ref.dq).max() > 1e-3


@pytest.mark.parametrize("name", [b for b in BUGS if b.startswith("dropout")])
def test_dropout_bug_is_visible_in_statistics(name):
    one_hot = random_case(B=1, Hq=2, Hkv=2, Lq=4, Lk=8, Dk=8, Dv=8, dtype="float64", dropout_p=0.3,
                          grad_out=np.random.default_rng(5).standard_normal((1, 2, 4, 8)))
    one_hot = one_hot.replace(v=np.broadcast_to(np.eye(8), (1, 2, 8, 8)).copy())   # out = the dropped weights
    if name == "dropout_backward_fresh_mask":   # the forward is right; dV is not W^T dO for the W it returned
        for kernel, wrong in (("correct:naive", False), (f"buggy:{name}", True)):
            res = adapters.load("torch", kernel=f"tests.kernels.{kernel}")[0].run(one_hot, grads=True)
            assert (np.abs(res.grads["dv"] - np.swapaxes(res.out, -1, -2) @ one_hot.grad_out).max() > 0.1) == wrong
        return
    if name == "dropout_shared_across_heads":   # each head alone is right; the two heads drop the same weights
        for module, kernel, shared in (("correct", "naive", False), ("buggy", name, True)):
            kept = np.stack([run_kernel(module, kernel, one_hot.replace(seed=s)) for s in range(20)]) != 0
            assert (kept[:, :, 0] == kept[:, :, 1]).all() == shared
        return
    base = random_case(B=1, Hq=1, Hkv=1, Lq=4, Lk=8, dtype="float64", dropout_p=0.5)
    if name == "dropout_inverse_p":             # 1/p == 1/(1-p) at p = 0.5
        base = base.replace(dropout_p=0.1)
    ref = oracle(base).out
    outs = np.stack([run_kernel("buggy", name, base.replace(seed=s)) for s in range(300)])
    mean_err = np.abs(outs.mean(axis=0) - ref).max()
    if name in ("dropout_no_rescale", "dropout_inverse_p"):
        assert mean_err > 0.3            # E[out] = (1-p) * ref, or (1-p)/p * ref
    else:
        assert (outs == outs[0]).all()   # nothing is ever dropped


def test_every_bug_names_a_known_clause():
    import tomllib

    clauses = {c["id"] for c in tomllib.loads((ROOT / "spec" / "clauses.toml").read_text())["clause"]}
    assert len(BUGS) >= 18
    for name in BUGS:
        fn = buggy.BUGS[name]
        assert fn.clause in clauses and "Defect" in fn.__doc__, name
        assert set(WITNESSES) | set(MUTATION_WITNESSES) | set(GRADIENT_WITNESSES) | {"dropout_no_rescale", "dropout_ignored", "dropout_inverse_p", "dropout_shared_across_heads", "dropout_backward_fresh_mask"} >= {name}


# ---- the suite against the catalogue (slow: one suite run per kernel) ------------
@pytest.mark.slow
@pytest.mark.parametrize("name", CORRECT)
def test_suite_passes_correct_kernel(name, tmp_path):
    run = run_suite("torch", tmp_path / "run.json", kernel=f"tests.kernels.correct:{name}")
    assert run.report is not None, run.output_tail
    assert run.returncode == 0, f"{name} failed: {run.first_failure}\n{run.output_tail}"


@pytest.mark.slow
@pytest.mark.parametrize("name", BUGS)
def test_suite_catches_bug(name, tmp_path, record_property):
    run = run_suite("torch", tmp_path / "run.json", kernel=f"tests.kernels.buggy:{name}", stop_at_first=True)
    assert run.report is not None, run.output_tail
    f = run.first_failure or {}
    record_property("caught_by", run.caught_by)
    record_property("examples", f.get("examples"))
    record_property("seconds", round(run.wall_s, 1))
    print(f"{name}: caught by {run.caught_by} after {f.get('examples')} examples, {run.wall_s:.1f} s wall")
    assert run.returncode == 1, f"the suite did not catch {name} ({buggy.BUGS[name].clause}):\n{run.output_tail}"
