"""Witness cases for adapters/torch/divergences.toml: failing cases from GPU runs, stored as .npz in witnesses/."""
from __future__ import annotations

from pathlib import Path

from attnconf.conformance.engine.witnesses import witness
from attnconf.reference import Case

STORED = Path(__file__).resolve().parent / "witnesses"


@witness
def cudnn_masked_leak_half_torch() -> Case:
    """The exact float16 case torch's cuDNN path failed on an H100 (hidden logit 6.76e4; output 12920
    where the reference is -0.289), rebuilt from the run's log and stored as .npz."""
    return Case.load(STORED / "torch-cudnn-masked-leak-f16.npz")


@witness
def flash_grad_large_logits() -> Case:
    """float32, logits ~1e3, one fully-masked row: torch's CPU flash dV was 63x the baseline error
    (found by the ci profile under --hypothesis-seed=3; stored as .npz)."""
    return Case.load(STORED / "torch-cpu-flash-grad-large-logits-f32.npz")


@witness
def cudnn_padding_empty_rows_half() -> Case:
    """The float16 case (kv lengths 5, 2, 3; query lengths 4, 2, 0) whose 12 padded or emptied rows torch's
    cuDNN path filled with attention over their hidden keys on an H100 (up to 2.02 where the spec says 0):
    a conformance run's saved failing case, stored as .npz."""
    return Case.load(STORED / "torch-cudnn-padding-empty-rows-f16.npz")


@witness
def cudnn_empty_row_grads_half() -> Case:
    """The float16 case (a mask hiding one of two keys, kv length 0) whose dV torch's cuDNN path got wrong
    by 2.2 on an H100 (the spec's dV is 0): a conformance run's saved failing case, stored as .npz."""
    return Case.load(STORED / "torch-cudnn-empty-row-grads-f16.npz")


@witness
def efficient_grad_large_logits() -> Case:
    """float32, large logits, kv lengths 1 and 2: torch's CUDA memory-efficient dV was 1.46e3x the baseline
    error on an H100 (3.5e-4 at |dV| 2.18), a conformance run's saved failing case stored as .npz."""
    return Case.load(STORED / "torch-cuda-efficient-grad-large-logits-f32.npz")
