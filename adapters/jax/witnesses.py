"""Witness cases for adapters/jax/divergences.toml: failing cases from GPU runs, stored as .npz in witnesses/."""
from __future__ import annotations

from pathlib import Path

from attnconf.conformance.engine.witnesses import witness
from attnconf.reference import Case

STORED = Path(__file__).resolve().parent / "witnesses"


@witness
def cudnn_masked_leak_half_jax() -> Case:
    """The exact float16 case jax:cudnn failed on an H100 (hidden logit 6.15e4; 60000 where the
    reference is -0.378), rebuilt from the run's log and stored as .npz."""
    return Case.load(STORED / "jax-cudnn-masked-leak-f16.npz")
