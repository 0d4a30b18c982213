"""Declared scope (adapters/scope.py) and the calling-convention adapters: declarations become the
adapter's scope, mistakes are one-line usage errors, NotImplementedError is unsupported, and
`scope()` / `scope_sentence` say what a certificate covers."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attnconf import adapters  # noqa: E402
from attnconf.adapters import scope  # noqa: E402
from attnconf.adapters.base import NotSupported  # noqa: E402
from attnconf.reference import Case  # noqa: E402


def _case(dtype="float16", B=1, H=2, Hkv=None, Lq=5, Lk=5, D=16, **kw) -> Case:
    rng = np.random.default_rng(0)
    return Case.build(rng.normal(size=(B, H, Lq, D)), rng.normal(size=(B, Hkv or H, Lk, D)),
                      rng.normal(size=(B, Hkv or H, Lk, D)), dtype=dtype, **kw)


def load(kernel: str, **kw):
    return adapters.load("torch", kernel=f"tests.kernels.{kernel}", **kw)[0]


def test_sdpa_declaration_becomes_the_scope():
    a = load("scoped:sdpa_half")
    assert a.dtypes == ("float16", "bfloat16")
    assert "grads" not in a.capabilities and "dropout" not in a.capabilities and "mask" not in a.capabilities
    assert a.supports(_case()) is True
    assert "float32" in a.supports(_case(dtype="float32"))
    assert "mask" in a.supports(_case(mask=np.ones((5, 5), bool)))
    assert "head dims [8, 16, 64]" in a.supports(_case(D=32))
    assert "up to 64" in a.supports(_case(Lq=65, Lk=65))
    assert "grads" in a.supports(_case(), need={"grads"})
    s = a.scope()
    assert s["source"] == "sdpa_half.attnconf_capabilities" and s["limits"] == {"head_dims": [8, 16, 64], "max_seqlen": 64}
    text = scope.scope_sentence(s)
    assert text.startswith("certified for float16/bfloat16, forward only, no dropout, ")
    assert "not covered: float64, float32, gradients" in text and "boolean masks" in text


def test_missing_declaration_means_the_full_convention():
    a = load("flash:flash_attn_func", convention="flash_attn")
    s = a.scope()
    assert s["source"] == "full flash_attn convention (no declaration)"
    assert s["grads"] and s["dropout"] and s["dtypes"] == ["float64", "float32", "float16", "bfloat16"]
    assert {"window_bottom_right", "softcap", "alibi", "lse", "causal_bottom_right", "gqa"} <= set(s["features"])
    assert "boolean masks" in s["outside_convention"]
    assert "outside the flash_attn convention" in scope.scope_sentence(s)


def test_half_precision_forward_only_certificate_reads_right():
    s = load("flash:flash_attn_func_half", convention="flash_attn").scope()
    text = scope.scope_sentence(s)
    assert text.startswith("certified for float16/bfloat16, forward only, dropout, ALiBi, ")
    assert "not covered: float64, float32, gradients, Dv != Dk" in text
    assert "sliding window bottom-right" in text and "softcap" in text and "log-sum-exp" in text


@pytest.mark.parametrize("kernel, message", [
    ("scoped:unknown_key", "unknown key(s) backward"),
    ("scoped:unknown_feature", "unknown feature(s) causal_magic"),
])
def test_bad_declarations_are_one_line_usage_errors(kernel, message):
    with pytest.raises(adapters.UsageError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        load(kernel)
    assert "\n" not in str(info.value)


def test_a_feature_the_convention_cannot_express_is_refused():
    with pytest.raises(adapters.UsageError, match="flash_attn convention cannot express mask"):
        load("scoped:flash_with_mask", convention="flash_attn")


def test_capabilities_file_wins_and_is_validated(tmp_path):
    good = tmp_path / "caps.toml"
    good.write_text('dtypes = ["bfloat16"]\ngrads = false\nfeatures = ["causal_bottom_right", "window_bottom_right"]\n'
                    'head_dims = {max = 128}\n')
    a = load("flash:flash_attn_func", convention="flash_attn", capabilities=str(good))
    assert a.dtypes == ("bfloat16",) and a.max_head_dim == 128 and "grads" not in a.capabilities
    assert a.capabilities == frozenset({"causal_bottom_right", "window_bottom_right", "dropout"})
    assert a.scope_source == f"--capabilities {good}"
    table = tmp_path / "table.toml"
    table.write_text('[attnconf_capabilities]\ndtypes = ["float32"]\n')
    assert load("flash:flash_attn_func", convention="flash_attn", capabilities=str(table)).dtypes == ("float32",)
    for text, message in (('dtypes = ["float8"]', "unknown dtype"), ('grads = "no"', "must be true or false"),
                          ('head_dims = []', "head_dims"), ('max_seqlen = -3', "positive integer"),
                          ("dtypes = [", "not valid TOML")):
        bad = tmp_path / "bad.toml"
        bad.write_text(text + "\n")
        with pytest.raises(adapters.UsageError, match=message):
            load("flash:flash_attn_func", convention="flash_attn", capabilities=str(bad))
    with pytest.raises(adapters.UsageError, match="no such file"):
        load("flash:flash_attn_func", convention="flash_attn", capabilities=str(tmp_path / "missing.toml"))


def test_kvcache_has_no_backward():
    with pytest.raises(adapters.UsageError, match="has no backward"):
        adapters.load("torch", kernel="tests.kernels.flash:flash_attn_with_kvcache", convention="flash_attn_kvcache",
                      capabilities=str(_write(["grads = true"])))


def _write(lines, _n=[0]):
    import tempfile
    from pathlib import Path

    _n[0] += 1
    p = Path(tempfile.mkdtemp()) / f"caps{_n[0]}.toml"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_not_implemented_is_unsupported_not_passed():
    a = load("scoped:sdpa_no_masks")
    assert a.supports(_case(dtype="float32", mask=np.ones((5, 5), bool))) is True    # undeclared: full scope
    with pytest.raises(NotSupported, match="NotImplementedError: masks are not implemented"):
        a.run(_case(dtype="float32", mask=np.ones((5, 5), bool)))
    assert a.run(_case(dtype="float32")).out.shape == (1, 2, 5, 16)


def test_declared_limits_and_features_for_a_convention():
    a = load("scoped:flash_windows_only", convention="flash_attn")
    assert a.supports(_case(dtype="float32", window=(1, 0), Lq=3, Lk=7)) is True
    assert "does not declare softcap" in a.supports(_case(dtype="float32", softcap=2.0))
    assert "outside the flash_attn convention: bias" in a.supports(_case(dtype="float32", bias=np.zeros((5, 5))))
    assert "head dim <= 32" in a.supports(_case(dtype="float32", D=64))


@pytest.mark.parametrize("convention, message", [
    ("flash_attn", "keyword(s) q, k, v, dropout_p"),
    ("flashinfer_decode", "keyword(s) q, k, v, kv_layout"),
])
def test_signature_must_take_the_conventions_keywords(convention, message):
    with pytest.raises(adapters.UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load("scoped:flash_positional_only", convention=convention)


def test_unknown_convention_and_backend_mismatch():
    with pytest.raises(adapters.UsageError, match="unknown --convention 'xformers' for backend 'torch'; choose from: "
                                                  "sdpa, flash_attn"):
        load("flash:flash_attn_func", convention="xformers")
    with pytest.raises(adapters.UsageError, match="unknown --convention 'flash_attn' for backend 'numpy'"):
        adapters.load("numpy", kernel="tests.kernels.flash:flash_attn_func", convention="flash_attn")
    with pytest.raises(adapters.UsageError, match="describe a --kernel"):
        adapters.load("torch", convention="flash_attn")


def test_requirements_rename_coinciding_alignments():
    a = load("flash:flash_attn_func", convention="flash_attn")
    assert a.supports(_case(causal="top_left")) is True                      # Lq == Lk: the same mask
    assert "causal_top_left" in a.supports(_case(causal="top_left", Lq=3, Lk=7))
    assert a.supports(_case(window=(1, 1), window_align="top_left")) is True
    assert "alibi_top_left" in a.supports(_case(alibi_slopes=np.ones(2), window_align="top_left", Lq=3, Lk=7))
    assert a.supports(_case(alibi_slopes=np.ones(2), window_align="top_left")) is True    # Lq == Lk: the same
    assert "its lse is float32" in a.supports(_case(dtype="float64"), need={"lse"})


# ---- fitting generated cases to a scope (conformance/engine/scope_fit.py) -------------------------------
def test_fit_projects_onto_the_scope_and_is_idempotent():
    from attnconf.conformance.engine.scope_fit import fit

    flash = load("flash:flash_attn_func", convention="flash_attn")
    rich = _case(dtype="float32", B=2, H=4, Hkv=2, Lq=5, Lk=9, mask=np.ones((5, 9), bool), causal="top_left",
                 kv_lengths=[3, 9], softcap=2.0, window=(1, 1), alibi_slopes=np.ones(4))
    fitted = fit(rich, flash, record=False)
    assert fitted is not None and flash.supports(fitted) is True
    assert fitted.mask is None and fitted.kv_lengths is None and fitted.causal == "bottom_right"
    assert fitted.softcap == 2.0 and fitted.window == (1, 1) and fitted.alibi_slopes is not None   # kept: in scope
    assert fit(fitted, flash, record=False) is fitted                                               # idempotent
    decode = load("flash:single_decode_with_kv_cache", convention="flashinfer_decode")
    one = fit(rich, decode, record=False)
    assert one is not None and one.shape["Lq"] == 1 and one.softcap == 2.0 and one.alibi_slopes is None
    half = load("flash:flash_attn_func_half", convention="flash_attn")
    assert fit(rich, half, record=False).dtype == "bfloat16"
    assert fit(rich, half, need={"grads"}, record=False) is None                # not declared: nothing fits


def test_fit_keeps_within_declared_head_dims():
    from attnconf.conformance.engine.scope_fit import fit

    a = load("scoped:sdpa_half")
    c = fit(_case(dtype="float32", D=40, Lq=70, Lk=70, mask=np.ones((70, 70), bool)), a, record=False)
    assert c is not None and c.shape["Dk"] == 16 and c.shape["Lk"] <= 64 and c.dtype == "bfloat16"
