"""The spec, the tests and the divergence files agree: one declaration per clause.

Every clause in spec/clauses.toml is explained in SPEC.md and checked by at
least one test; every id a test cites exists; every divergence file parses
and names a known clause, region and witness.
"""
import re
from pathlib import Path

import numpy as np
import pytest

from attnconf import spec
from attnconf.adapters.registry import BUILTIN, divergences_file
from attnconf.conformance.engine.divergences import Divergences, backend_entries

ROOT = Path(__file__).resolve().parent.parent
CITE = re.compile(r"clauses\(([^)]*)\)")
ID = re.compile(r'"(ATTN-[A-Z0-9]+-\d+)"')


def cited_ids() -> dict[str, set[str]]:
    cites: dict[str, set[str]] = {}
    for path in [*ROOT.glob("conformance/test_*.py"), *ROOT.glob("tests/test_*.py")]:
        for group in CITE.findall(path.read_text()):
            for cid in ID.findall(group):
                cites.setdefault(cid, set()).add(path.name)
    return cites


def test_every_clause_is_in_spec_md():
    text = (ROOT / "spec" / "SPEC.md").read_text()
    missing = [c for c in spec.clauses() if f"**{c}**" not in text]
    assert not missing, f"clauses missing from SPEC.md: {missing}"


def test_spec_md_cites_no_unknown_clause():
    text = (ROOT / "spec" / "SPEC.md").read_text()
    unknown = sorted(set(re.findall(r"ATTN-[A-Z0-9]+-\d+", text)) - set(spec.clauses()))
    assert not unknown, f"SPEC.md names clauses not in clauses.toml: {unknown}"


# Clauses of SPEC section 24 whose text is written but whose tests come with the calling conventions
# (flash_attn_varlen, flash_attn_kvcache, the declared scope, the argument-honoured probes).
# Remove an id here as soon as a test cites it; nothing else belongs in this list.
PENDING_CONVENTION_CLAUSES = {"ATTN-VARLEN-1", "ATTN-VARLEN-2", "ATTN-PAGED-1", "ATTN-PAGED-2", "ATTN-PAGED-3",
                              "ATTN-ARG-1", "ATTN-SCOPE-1"}


def test_every_clause_is_checked_by_a_test():
    cites = cited_ids()
    unchecked = [c for c in spec.clauses() if c not in cites and c not in PENDING_CONVENTION_CLAUSES]
    assert not unchecked, f"clauses no test checks: {unchecked}"


def test_every_cited_clause_exists():
    unknown = {c: sorted(files) for c, files in cited_ids().items() if c not in spec.clauses()}
    assert not unknown, f"tests cite unknown clauses: {unknown}"


@pytest.mark.parametrize("path", [p for b in BUILTIN if (p := divergences_file(b.name))], ids=lambda p: p.parent.name)
def test_divergence_files_are_valid(path):
    entries = spec.load_divergences(path)
    Divergences(entries, "cpu")  # raises on unknown region or witness
    ids = [e["id"] for e in entries]
    assert len(ids) == len(set(ids)), f"duplicate ids in {path.name}"


def test_malformed_divergence_file_names_line_and_field(tmp_path):
    bad = tmp_path / "x.toml"
    bad.write_text('[[divergence]]\nid = "A"\nclause = "ATTN-OP-1"\n\n[[divergence]]\nid = "B"\nclause = "NOPE"\n'
                   'kind = "divergent"\nimplementations = ["*"]\nregion = "any"\nreason = "r"\nwitness = "w"\n')
    with pytest.raises(spec.SpecError, match=r"x.toml:1 \(entry 'A'\): missing field 'kind'"):
        spec.load_divergences(bad)


def _tf_half_entry(**change):
    entry = next(e for e in backend_entries("tensorflow") if e["id"] == "TF-EAGER-F16-ACCUMULATION")
    return {**entry, **change}


@pytest.mark.parametrize(("change", "message"), [
    ({"bound": None}, "needs a positive numeric field 'bound'"),
    ({"bound": 0.0}, "needs a positive numeric field 'bound'"),
    ({"instead": "float32_precision", "bound": None}, "needs an alternative held to a stated bound"),
    ({"region": "dtype_half", "instead": "float32_precision"}, "takes no bound"),
])
def test_an_entry_over_everything_states_a_bound_that_its_alternative_applies(change, message):
    """Region 'any' exempts nothing unchecked: the entry states a bound, and only an alternative that
    multiplies its allowance by it may carry one."""
    from attnconf.conformance.engine.alternatives import load_all
    from attnconf.conformance.engine.divergences import DivergenceError

    load_all()
    entry = {k: v for k, v in _tf_half_entry(**{"region": "any", **change}).items() if v is not None}
    with pytest.raises(DivergenceError, match=message):
        Divergences([entry], "cpu")


def test_the_stated_bound_is_the_factor_the_alternative_judges_with(monkeypatch):
    from attnconf.conformance.engine import alternatives
    from attnconf.conformance import strategies as st
    from attnconf.reference import oracle

    seen = []
    real = alternatives.T.judge_arrays
    monkeypatch.setattr(alternatives.T, "judge_arrays",
                        lambda *a, **k: seen.append(k.get("factor", 1.0)) or real(*a, **k))
    case = st.fixed_case(3, dtype="float16")
    res = type("R", (), {"out": oracle(case).out, "lse": None, "grads": None})()
    masks = {"out": np.ones(case.out_shape, bool)}
    for bound in (1.0, 0.25):
        alternatives.ALTERNATIVES["half_accumulation"].check(_tf_half_entry(bound=bound), case, res, masks)
    assert seen == [1.0, 0.25]


KEYWORDS = re.compile(r"\b(MUST|MUST NOT|SHOULD|SHOULD NOT|MAY)\b")


def test_every_clause_has_a_level():
    bad = {c: d.get("level") for c, d in spec.clauses().items() if d.get("level") not in spec.LEVELS}
    assert not bad, f"clauses without a level in {spec.LEVELS}: {bad}"


def test_requirements_carry_an_rfc2119_keyword_and_the_rest_say_why_they_are_not():
    """Normative and recorded clauses state themselves with MUST / SHOULD / MAY; an informative clause states
    no requirement (no MUST) and says after a colon, or in a sentence of its own, why it is not one."""
    for cid, c in spec.clauses().items():
        text = c["statement"]
        if c["level"] == "informative":
            assert "MUST" not in text, f"{cid}: an informative clause states a requirement"
            assert re.search(r"(: a |: theorems? |; this describes|No test|not a proven|: a worked)", text), \
                f"{cid}: an informative clause must say why it is not a kernel requirement"
        else:
            assert KEYWORDS.search(text), f"{cid}: a {c['level']} clause without an RFC 2119 keyword"
            if c["level"] == "recorded":
                assert "recorded" in text and "no verdict depends on it" in text, cid


def test_spec_md_sets_informative_and_recorded_clauses_apart():
    """SPEC.md's clause-level section lists every non-normative clause under its level, and no other."""
    text = (ROOT / "spec" / "SPEC.md").read_text()
    section = text[text.index("## Clause levels"):]
    for level in ("informative", "recorded"):
        line = next(l for l in section.splitlines() if l.startswith(f"- **{level.capitalize()}**"))
        listed = set(re.findall(r"ATTN-[A-Z0-9]+-\d+", line))
        want = {c for c, d in spec.clauses().items() if d["level"] == level}
        assert listed == want, f"SPEC.md's {level} list differs from clauses.toml: {sorted(listed ^ want)}"


def test_each_clause_is_stated_once_in_spec_md():
    text = (ROOT / "spec" / "SPEC.md").read_text()
    twice = [c for c in spec.clauses() if text.count(f"**{c}**") > 1]
    assert "(ATTN-ARG-1, as the" not in text, "ATTN-ARG-1 is stated in section 24 only (issue 25)"
    assert not twice, f"clauses stated more than once in SPEC.md: {twice}"
