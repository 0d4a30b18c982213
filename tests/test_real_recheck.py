"""reports/real/recheck.py splits a kernel's error between rows that see keys and rows that see none."""
from __future__ import annotations

import numpy as np
import torch

from attnconf.reference import Case
from reports.real import recheck


def mean_in_empty_rows(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                       enable_gqa=False):
    """Torch's SDPA, except that a row whose bool mask is all False gets the mean of all values."""
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, scale=scale)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        empty = ~attn_mask.any(-1, keepdim=True)
        out = torch.where(empty, value.mean(-2, keepdim=True), torch.nan_to_num(out))
    return out


def _case(tmp_path) -> str:
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(1, 1, 3, 8)) for _ in range(3))
    mask = np.ones((1, 1, 3, 3), dtype=bool)
    mask[0, 0, 1] = False
    return Case.build(q, k, v, mask=mask, dtype="float32").save(tmp_path / "case.npz")


def _line(tmp_path, kernel: str) -> str:
    from attnconf.adapters import load

    adapter = load("torch", kernel=kernel)[0]
    return recheck.recheck(adapter, _case(tmp_path))


def test_error_only_in_empty_rows_is_reported_there(tmp_path):
    line = _line(tmp_path, "tests.test_real_recheck:mean_in_empty_rows")
    seen = float(line.split("seen-rows err ")[1].split()[0])
    empty = float(line.split("err ")[-1])
    assert "empty rows 1" in line and seen < 1e-6 < empty, line


def test_a_correct_kernel_has_no_error_anywhere(tmp_path):
    line = _line(tmp_path, "tests.kernels.correct:naive")
    assert line.endswith("empty rows 1 err 0"), line
