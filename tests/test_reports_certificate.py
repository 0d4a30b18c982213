"""Certificates for kernel runs: content of the Markdown and JSON, escaping, file names."""

from __future__ import annotations

import json
import re
from pathlib import Path

from attnconf.reports import certificate, merge, runfile
from tests.test_reports_fixtures import FIXTURES, jax_cpu, upgrade


def test_certificate_content(tmp_path: Path) -> None:
    run = runfile.load(FIXTURES / "kernel-cuda.json")
    md_path, json_path = certificate.write(run, tmp_path)
    assert md_path.parent.name == "certificates"
    assert re.fullmatch(r"[a-z0-9-]+", md_path.stem) and md_path.stem.endswith("torch-cuda")
    data = json.loads(json_path.read_text(encoding="utf-8"))
    assert data["verdict"] == "NONCONFORMANT" and data["certificate_version"] == 2
    by = data["cells_by_status"]
    assert "ATTN-MASK-1@float16" in by["failing"] and "ATTN-OP-1@bfloat16" in by["conformant"]
    assert {c["clause"] for c in data["cells"]} <= {c.id for c in merge.load_clauses()}
    assert data["ratios"] == {"bfloat16": {"max": 0.88, "cases": 10}, "float16": {"max": 3.0, "cases": 20}}
    assert data["environment"]["device_name"] == "NVIDIA H100 80GB HBM3"

    text = md_path.read_text(encoding="utf-8")
    assert "**Verdict: NONCONFORMANT** on torch / cuda" in text
    assert "### Failed clauses" in text and "**ATTN-MASK-1** (Boolean mask polarity) at float16" in text
    assert "| float16 | 3.00 | 20 |" in text
    assert "<script" not in text and "&lt;script&gt;" in text


def test_divergences_are_not_passes() -> None:
    cert = certificate.build(upgrade(jax_cpu()))
    assert cert["verdict"] == "CONFORMANT_WITH_DIVERGENCES"
    divergent = cert["cells_by_status"]["divergent"]
    assert divergent and all(k.startswith("ATTN-EMPTY-1@") for k in divergent)
    assert not any(k.startswith("ATTN-EMPTY-1@") for k in cert["cells_by_status"].get("conformant", []))
    text = certificate.render_markdown(cert)
    assert "- JAX-EMPTY-MEAN (ATTN-EMPTY-1, divergent): region fully\\_masked\\_rows, instead mean\\_of\\_values" in text
