"""Every Hypothesis strategy of the suite: cases that reach the corners where kernels break.

Shapes, masks, dtypes and value regimes are drawn by Hypothesis (so they shrink); the array values come from
a NumPy generator seeded by a drawn seed (so they are cheap and a case replays from its seed). Generation
happens inside a cell (`cell(dtype, scope)`, see cells.py), so that cases stay inside the cell's dtype and
the implementation's declared scope.

One module per family of inputs:
    cells        the cell drawn for: dtype, declared scope, features offered (the one setter and reader)
    sizes        batch, heads, lengths, head dims; the size budget; the palette
    values       q, k, v of a value regime; scales, ALiBi slopes, sink logits
    plain        `cases` anywhere in the domain, fixed shapes, GQA, causal, one-hot readable, identical keys
    pins         the pinned cases run first (AGREEMENT_PINS, CONVENTION_PINS)
    masks        masks, hidden keys, empty rows, per-batch masks
    dropout      one-hot dropout cases
    probes       two-key scale cases and the argument probes (ATTN-ARG-1)
    windows      sliding windows and chunks
    variants     softcap, ALiBi, sinks, their mixtures, decode
    conventions  calling conventions: varlen, paged KV cache, lse
and the fixed shapes and cases beside the draws:
    boundaries   the shapes where real kernels branch (boundaries_table renders spec/BOUNDARIES.md)
    palette      the few shapes a compile-per-shape implementation is run on
    branch_cases every boundary in every family, as fixed cases (test_branch_points.py)
    long_cases   cases past 16384 positions and their sampled rows (test_long.py)
This module re-exports what the suite, the engine and the project's tests use of the draws, so they import
it as one; the fixed shapes and cases are imported by module.
"""
from __future__ import annotations

from attnconf.conformance.strategies.cells import (REQUIRABLE, cell, dtype_choice, fixed_cases, offer,
                                                  offered)
from attnconf.conformance.strategies.conventions import (convention_cases, lse_cases, lse_empty_cases,
                                                         lse_merge_cases, paged_cases, perturb_sequence, varlen_cases)
from attnconf.conformance.strategies.dropout import dropout_cases, dropout_cooccurrence_cases, dropout_grad_cases
from attnconf.conformance.strategies.masks import (empty_row_cases, hidden_key_cases, mask_cases,
                                                   per_batch_mask_cases)
from attnconf.conformance.strategies.pins import AGREEMENT_PINS, CONVENTION_PINS, fixed_case, pinned
from attnconf.conformance.strategies.plain import (cases, causal_cases, gqa_cases, identical_key_cases, onehot_cases,
                                                   without_q_lengths)
from attnconf.conformance.strategies.probes import probe_case, probe_cases, two_key_cases
from attnconf.conformance.strategies.sizes import (BUDGET, GROUPS, HEAD_DIMS, LARGE_LENGTHS, LONG_HISTORIES,
                                                   MEDIUM_LENGTHS, SHORT_QUERIES, SMALL_LENGTHS, shapes)
from attnconf.conformance.strategies.values import FINITE_MAX, geometric_slopes
from attnconf.conformance.strategies.variants import (alibi_as_bias, alibi_cases, alibi_probe_cases, decode_cases,
                                                      sink_cases, softcap_cases, softcap_probe_cases, variant_cases)
from attnconf.conformance.strategies.variants import scaled_logit_max as _scaled_logit_max
from attnconf.conformance.strategies.windows import (chunk_cases, window_cases, window_empty_row_cases,
                                                     window_probe_cases)
from attnconf.reference import DTYPES


__all__ = [
    "AGREEMENT_PINS", "BUDGET", "CONVENTION_PINS", "DTYPES", "FINITE_MAX", "GROUPS", "HEAD_DIMS", "LARGE_LENGTHS",
    "LONG_HISTORIES", "MEDIUM_LENGTHS", "REQUIRABLE", "SHORT_QUERIES", "SMALL_LENGTHS", "_scaled_logit_max",
    "alibi_as_bias", "alibi_cases", "alibi_probe_cases", "cases", "causal_cases", "cell", "chunk_cases",
    "convention_cases", "decode_cases", "dropout_cases", "dropout_cooccurrence_cases", "dropout_grad_cases",
    "dtype_choice", "empty_row_cases", "fixed_case", "fixed_cases", "geometric_slopes", "gqa_cases",
    "hidden_key_cases", "identical_key_cases", "lse_cases", "lse_empty_cases", "lse_merge_cases", "mask_cases",
    "offer", "offered", "onehot_cases", "paged_cases", "per_batch_mask_cases", "perturb_sequence", "pinned",
    "probe_case", "probe_cases", "shapes", "sink_cases", "softcap_cases", "softcap_probe_cases", "two_key_cases",
    "variant_cases", "varlen_cases", "window_cases", "window_empty_row_cases", "window_probe_cases",
    "without_q_lengths",
]
