"""Certificates for kernel runs: content of the Markdown and JSON, escaping, file names."""

from __future__ import annotations

import json
import re
from pathlib import Path

from attnconf.reports import certificate, merge, runfile
from tests.test_reports_fixtures import FIXTURES, jax_cpu


def test_certificate_content(tmp_path: Path) -> None:
    run = runfile.load(FIXTURES / "kernel-cuda.json")
    md_path, json_path = certificate.write(run, tmp_path)
    assert md_path.parent.name == "certificates"
    assert re.fullmatch(r"[a-z0-9-]+", md_path.stem) and md_path.stem.endswith("torch-cuda")
    data = json.loads(json_path.read_text(encoding="utf-8"))
    assert data["verdict"] == "NONCONFORMANT" and data["certificate_version"] == 1
    assert data["clauses"]["conformant"] == ["ATTN-OP-1", "ATTN-EMPTY-1", "ATTN-TOL-1"]
    assert data["clauses"]["failing"] == ["ATTN-MASK-1"]
    assert "ATTN-GQA-1" in data["clauses"]["not_run"]
    all_ids = [c.id for c in merge.load_clauses()]
    assert sorted(sum(data["clauses"].values(), [])) == sorted(all_ids)  # every clause listed once
    assert data["ratios"] == {"bfloat16": {"max": 0.88, "cases": 10}, "float16": {"max": 3.0, "cases": 20}}
    assert data["environment"]["device_name"] == "NVIDIA H100 80GB HBM3"

    text = md_path.read_text(encoding="utf-8")
    assert "**Verdict: NONCONFORMANT** on torch / cuda" in text
    assert "**Failing clauses (1)**: ATTN-MASK-1 (Boolean mask polarity)" in text
    assert "| float16 | 3.00 | 20 |" in text
    assert "<script" not in text and "&lt;script&gt;" in text


def test_divergences_are_not_passes() -> None:
    cert = certificate.build(jax_cpu())
    assert cert["verdict"] == "CONFORMANT_WITH_DIVERGENCES"
    assert cert["clauses"]["divergent"] == ["ATTN-EMPTY-1"]
    assert "ATTN-EMPTY-1" not in cert["clauses"]["conformant"]
    text = certificate.render_markdown(cert)
    assert "- JAX-EMPTY-MEAN (ATTN-EMPTY-1, divergent): fully-masked rows output the mean of V" in text
