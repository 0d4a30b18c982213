"""The accuracy contract a kernel may declare in its scope (`quantization` or `accuracy`), parsed and
validated where every other declaration is (adapters/scope.py), so that declaring one never reaches
into the engine; conformance/engine/alternatives_contracts.py judges a kernel by it."""
from __future__ import annotations

from typing import Any

INT8_DEFAULTS = {"q_block": 128, "k_block": 64, "smooth_k": True, "pv": "float16"}
ACCURACY_KEYS = ("cosine", "rel_l1")


class ContractError(ValueError):
    """A malformed contract declaration (one line naming the key)."""


def parse(decl: dict[str, Any], source: str) -> dict[str, Any] | None:
    """The contract in a scope declaration ({"quantization": {...}} or {"accuracy": {...}}), validated."""
    from attnconf.reference.quantize import SCHEMES

    quant, acc = decl.get("quantization"), decl.get("accuracy")
    if quant is None and acc is None:
        return None
    if quant is not None and acc is not None:
        raise ContractError(f"{source}: declare either 'quantization' or 'accuracy', not both")
    if quant is not None:
        if not isinstance(quant, dict) or quant.get("scheme") not in SCHEMES:
            raise ContractError(f"{source}: 'quantization' must be a table with scheme one of {', '.join(SCHEMES)}; "
                                f"got {quant!r}")
        out = dict(quant)
        if out["scheme"] == "int8_per_block":
            out = {"scheme": "int8_per_block", **INT8_DEFAULTS, **quant}
            for key in ("q_block", "k_block"):
                if isinstance(out[key], bool) or not isinstance(out[key], int) or out[key] < 1:
                    raise ContractError(f"{source}: quantization.{key} must be a positive integer; got {out[key]!r}")
            if not isinstance(out["smooth_k"], bool) or out["pv"] not in ("float16", "float32"):
                raise ContractError(f"{source}: quantization.smooth_k must be true/false and pv float16 or float32")
        return {"quantization": out}
    if not isinstance(acc, dict) or set(acc) - set(ACCURACY_KEYS) or not acc:
        raise ContractError(f"{source}: 'accuracy' must be a table of {', '.join(ACCURACY_KEYS)}; got {acc!r}")
    for key, val in acc.items():
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0 < val <= 1:
            raise ContractError(f"{source}: accuracy.{key} must be a number in (0, 1]; got {val!r}")
    return {"accuracy": {k: float(v) for k, v in acc.items()}}
