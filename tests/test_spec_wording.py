"""SPEC.md states each clause in the words of spec/clauses.toml, in RFC 2119 keywords (issue 25, item 7).

clauses.toml is the one source of a clause's text. SPEC.md opens each clause's paragraph with the bold id,
the level where it is not normative ("(informative)", "(recorded)"), and then the clause's statement word
for word; what follows in the paragraph explains and derives it. So the prose cannot drift from the
machine-readable spec, and a reader sees the requirement before its explanation.

A normative clause states itself with MUST, MUST NOT, SHOULD or MAY. An informative or recorded clause is no
kernel requirement: neither its statement nor its paragraph says MUST (a recorded clause says SHOULD or MAY
and that no verdict depends on it).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnconf import spec

SPEC_MD = Path(__file__).resolve().parent.parent / "spec" / "SPEC.md"
KEYWORD = re.compile(r"\b(MUST|SHOULD|MAY)\b")
MARK = {"normative": "", "informative": "(informative) ", "recorded": "(recorded) "}


def words(text: str) -> str:
    return " ".join(text.split())


def paragraphs() -> list[str]:
    return [words(p) for p in re.split(r"\n\s*\n", SPEC_MD.read_text())]


def clause_paragraph(cid: str, paras: list[str]) -> str:
    """The one paragraph that opens with the clause's bold id."""
    found = [p for p in paras if p.startswith(f"**{cid}** ")]
    assert len(found) == 1, f"{cid}: {len(found)} paragraphs of SPEC.md open with **{cid}** (want exactly 1)"
    return found[0]


@pytest.fixture(scope="module")
def paras() -> list[str]:
    return paragraphs()


@pytest.mark.parametrize("cid", list(spec.clauses()))
def test_the_paragraph_opens_with_the_clause_statement(cid, paras):
    c = spec.clauses()[cid]
    want = f"**{cid}** {MARK[c['level']]}{words(c['statement'])}"
    got = clause_paragraph(cid, paras)
    assert got.startswith(want), (f"{cid}: SPEC.md's paragraph must open with the id, the level mark and the "
                                  f"statement of clauses.toml:\n  want: {want}\n  have: {got[:len(want) + 40]}")


@pytest.mark.parametrize("cid", list(spec.normative()))
def test_a_normative_clause_states_an_rfc2119_keyword(cid, paras):
    assert KEYWORD.search(spec.clauses()[cid]["statement"]), f"{cid}: its statement has no MUST/SHOULD/MAY"
    assert KEYWORD.search(clause_paragraph(cid, paras)), f"{cid}: its SPEC.md paragraph has no MUST/SHOULD/MAY"


@pytest.mark.parametrize("cid", [c for c, d in spec.clauses().items() if d["level"] != "normative"])
def test_an_informative_or_recorded_clause_states_no_requirement(cid, paras):
    c = spec.clauses()[cid]
    assert "MUST" not in c["statement"], f"{cid} is {c['level']}: its statement says MUST"
    assert "MUST" not in clause_paragraph(cid, paras), f"{cid} is {c['level']}: its SPEC.md paragraph says MUST"


def test_the_check_sees_a_drifted_statement(paras):
    """The comparison is word for word: one changed word in the prose is caught."""
    cid = "ATTN-OP-5"
    drifted = [p.replace("MUST have", "has") if p.startswith(f"**{cid}**") else p for p in paras]
    c = spec.clauses()[cid]
    assert not clause_paragraph(cid, drifted).startswith(f"**{cid}** {words(c['statement'])}")
    assert not KEYWORD.search(clause_paragraph(cid, drifted))
