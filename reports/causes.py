"""How a cause of failures (the run file's `causes`, conformance/engine/causes.py) reads: one line for the terminal
summary and the certificate, from the run file's data alone."""
from __future__ import annotations

from typing import Any


def cause_line(g: dict[str, Any]) -> str:
    """One line for the terminal and the certificate."""
    text = f"{g['title']} ({g['id']}): explains {g['failures']} failure(s) of {', '.join(g['clauses'])}"
    text += f" in {len(g['tests'])} test(s)"
    if g.get("declaration"):
        text += f"; documented behaviour? declare {g['declaration']}"
    return text
