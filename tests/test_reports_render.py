"""Markdown and HTML output: content, self-containment, and escaping of every run-file string."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from attnconf.reports import html as html_report
from attnconf.reports import markdown, merge, runfile
from tests.test_reports_fixtures import FIXTURES, GOOD, XSS

ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "nav", "a", "table",
                "thead", "tbody", "tr", "th", "td", "b", "br", "span", "code", "details", "summary", "div",
                "ul", "li", "img"}


class TagCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


@pytest.fixture(scope="module")
def report() -> merge.Report:
    runs = [runfile.load(FIXTURES / n) for n in GOOD]
    runs[1]["divergences"][0]["link"] = "javascript:alert(3)"
    return merge.build(runs)


@pytest.fixture(scope="module")
def page(report: merge.Report) -> str:
    return html_report.render(report)


def test_html_has_only_expected_markup(page: str) -> None:
    parser = TagCollector()
    parser.feed(page)
    tags = {t for t, _ in parser.tags}
    assert tags <= ALLOWED_TAGS, tags - ALLOWED_TAGS
    for tag, attrs in parser.tags:
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)
        if tag == "img":
            assert attrs["src"].startswith("data:image/png;base64,")
        if tag == "a":
            assert attrs["href"].startswith(("#", "https://", "findings/")), attrs
    assert "<script" not in page.lower() and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # shown as text, in names, kernel, message
    assert 'href="javascript' not in page  # a divergence link that is not https:// is not linked


def test_html_is_self_contained(page: str) -> None:
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert "<link" not in page and "@import" not in page and "url(" not in page
    parser = TagCollector()
    parser.feed(page)
    assert all(not attrs.get("src", "data:").startswith("http") for _, attrs in parser.tags)


def test_html_content(page: str) -> None:
    # drill-down: the failing record's message, case and replay command sit inside the cell's <details>
    cell = re.search(r'<td class="cell failing"[^>]*><details><summary>✗ 12.50 \(\d+\)</summary>(.*?)</details>', page)
    assert cell is not None
    assert "ratio 12.5 &gt; 1" in cell.group(1) and "Hkv=2 Lq=9" in cell.group(1)
    assert "conformance.replay reports/failures/torch_sdpa-efficient-1.npz" in cell.group(1)
    # divergent cells link to the divergence entry's anchor
    assert 'href="#div-TORCH-EMPTY-NAN"' in page and 'id="div-TORCH-EMPTY-NAN"' in page
    assert page.count('src="data:image/png;base64,') == 2  # ratio vs Lk, ratio vs Dk
    assert "NONCONFORMANT" in page and "CONFORMANT_WITH_DIVERGENCES" in page
    assert "finite output (NaN lost)" in page  # observations
    assert "2/3" in page and "P02" in page  # pairwise table


def test_markdown_content(report: merge.Report) -> None:
    text = markdown.render(report)
    assert re.search(r"\| ATTN-OP-1 Definition \| ✅ 0.05 \(\d+\) \| ✅ 0.42 \(\d+\) \| ✅ 0.61 \(\d+\) \|", text), text[:3000]
    assert "⚠️ TORCH-EMPTY-NAN" in text and "❌ 12.50" in text and "➖" in text and "## Findings" in text
    assert "| numpy:naive (cpu) | torch:sdpa-math (cpu) | 3/3 | agree |  |" in text
    assert "**NONCONFORMANT**" in text
    assert "replay: `.venv/bin/python -m conformance.replay" in text
    # every table row has as many cells as its header
    for block in re.findall(r"((?:^\|.*\|\n)+)", text, flags=re.M):
        rows = block.strip("\n").split("\n")
        widths = {len(re.split(r"(?<!\\)\|", r)) for r in rows}
        assert len(widths) == 1, rows[:3]


def test_markdown_escapes_run_file_text(report: merge.Report) -> None:
    text = markdown.render(report)
    outside_code = re.sub(r"`[^`]*`", "", text)
    assert "<script" not in outside_code and "<img" not in outside_code
    assert "&lt;script&gt;" in outside_code
    assert markdown.md("a|b\nc <x> `y`") == "a\\|b c &lt;x&gt; \\`y\\`"
    assert markdown.code("x`y") == "`x'y`"


def test_plots_accept_mathtext_and_nonfinite() -> None:
    from attnconf.reports.plots import ratio_plots

    samples = [{"dtype": "float32", "Lk": 8, "Dk": 16, "ratio_max": r, "impl": "$x^2$ (cpu)"}
               for r in (0.5, float("nan"), float("inf"))]
    plots = ratio_plots(samples)
    assert [t for t, _, _ in plots] == ["Error ratio vs key sequence length Lk", "Error ratio vs head dimension Dk"]
    assert plots[0][2] == 2
