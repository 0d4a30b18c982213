"""The certificate badge: an SVG beside certificate.md that a kernel's README can show.

Green for CONFORMANT, amber where the verdict holds with documented divergences or is INCOMPLETE, red for
NONCONFORMANT; the text says the verdict and the scope it was certified for (the dtypes checked), so a
badge never reads as a claim wider than the run."""
from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape

COLOURS = {"CONFORMANT": "#2e7d32", "CONFORMANT_WITH_DIVERGENCES": "#e69500", "INCOMPLETE": "#e69500",
           "NONCONFORMANT": "#c62828"}
SHORT = {"CONFORMANT_WITH_DIVERGENCES": "conformant with divergences"}
CHAR_PX = 6.5     # Verdana 11px, about


def scope_text(cert: dict[str, Any]) -> str:
    """The dtypes of the declared scope(s), e.g. 'float16, float32'; 'declared scope' where none is stated."""
    dtypes: list[str] = []
    for s in (cert.get("scopes") or {}).values():
        for d in (s.get("declared") or {}).get("dtypes") or []:
            if d not in dtypes:
                dtypes.append(d)
    return ", ".join(dtypes) or "declared scope"


def render(cert: dict[str, Any]) -> str:
    verdict = cert["verdict"]
    left = "attnconf"
    right = f"{SHORT.get(verdict, verdict.lower())} | {scope_text(cert)}"
    lw, rw = int(len(left) * CHAR_PX) + 12, int(len(right) * CHAR_PX) + 12
    colour = COLOURS.get(verdict, "#9e9e9e")
    title = escape(f"attnconf: {verdict} ({scope_text(cert)})")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{lw + rw}" height="20" role="img" aria-label="{title}">'
            f'<title>{title}</title>'
            f'<rect width="{lw}" height="20" fill="#555"/><rect x="{lw}" width="{rw}" height="20" fill="{colour}"/>'
            f'<g fill="#fff" font-family="Verdana,DejaVu Sans,sans-serif" font-size="11">'
            f'<text x="6" y="14">{escape(left)}</text><text x="{lw + 6}" y="14">{escape(right)}</text></g></svg>\n')
