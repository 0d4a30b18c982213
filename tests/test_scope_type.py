"""The one `Scope` (adapters/scope.py): what `supports` answers, what a run file records and what the
certificate says all come from it, so they cannot disagree."""
from __future__ import annotations

import numpy as np

from attnconf.adapters.base import Adapter
from attnconf.adapters.scope import FEATURE_WORDS, Scope, scope_sentence
from attnconf.reference import Case
from attnconf.spec.vocabulary import CAPABILITIES, DTYPES


class Narrow(Adapter):
    backend, name = "numpy", "test:narrow"
    dtypes = ("bfloat16", "float16")        # out of order on purpose: the scope lists them in DTYPES order
    capabilities = frozenset({"gqa", "causal_top_left", "lse"})
    max_head_dim = 32
    max_seqlen = 16


def _case(dtype: str = "float16", D: int = 8, L: int = 5, **kw) -> Case:
    rng = np.random.default_rng(0)
    return Case.build(rng.normal(size=(1, 2, L, D)), rng.normal(size=(1, 2, L, D)), rng.normal(size=(1, 2, L, D)),
                      dtype=dtype, **kw)


def test_fit_gives_the_first_reason_a_case_lies_outside():
    s = Scope.of(Narrow())
    assert s.fit(_case()) is True
    assert s.fit(_case(mask=np.ones((5, 5), bool))) == "test:narrow lacks mask"
    assert s.fit(_case(dtype="float32")) == "test:narrow does not run float32"
    assert s.fit(_case(D=64)) == "test:narrow supports head dim <= 32"
    assert s.fit(_case(L=17)) == "test:narrow runs sequences up to 16 only"
    assert s.fit(_case(), {"grads"}) == "test:narrow lacks grads"


def test_supports_is_the_scope_fit():
    a = Narrow()
    for case in (_case(), _case(dtype="float64"), _case(D=40), _case(mask=np.ones((5, 5), bool))):
        assert a.supports(case) == Scope.of(a).fit(case)


def test_a_recorded_scope_reads_back_as_the_same_sentence():
    s = Scope.of(Narrow())
    record = Narrow().scope()
    assert record["dtypes"] == ["float16", "bfloat16"] and record["limits"] == {"head_dims": {"max": 32}, "max_seqlen": 16}
    assert Scope.from_record(record).sentence() == s.sentence() == scope_sentence(record)
    certified, missing = s.words()
    assert certified.startswith("float16/bfloat16, forward only, no dropout, causal top-left, GQA/MQA, log-sum-exp")
    assert "head dim <= 32" in certified and "sequences up to 16" in certified
    assert missing.startswith("float64, float32, gradients, ") and "boolean masks" in missing


def test_an_old_or_partial_record_still_reads():
    assert Scope.from_record({"dtypes": ["float32"]}).sentence().startswith("certified for float32, forward only")
    flat = Scope.from_record({"dtypes": ["float16"], "features": ["grads", "mask"], "max_head_dim": 128,
                              "head_dims": None, "max_seqlen": 64})
    assert flat.grads and flat.features == {"mask"} and flat.max_head_dim == 128 and flat.max_seqlen == 64


def test_every_capability_has_words_and_everything_is_covered_once():
    assert CAPABILITIES <= set(FEATURE_WORDS)
    everything = Scope(DTYPES, True, True, frozenset(CAPABILITIES - {"grads", "dropout"}))
    assert everything.words()[1] == "nothing"
