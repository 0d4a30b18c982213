"""Read, validate and write run files (reports/schema.json).

A run file is the only thing that crosses from the test run to the reports: the pytest plugin
calls `write`, every report step calls `load`. Both validate against the published schema, so a
drift between writer and reader fails loudly at the boundary with a one-line message instead of
producing a wrong matrix.

Non-finite floats (an error ratio of NaN when an implementation returned NaN) are stored as the
strings "nan", "inf", "-inf": the file stays strict JSON that any JSON parser reads.
`load` turns them back into floats.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 2
SCHEMA_PATH = Path(__file__).with_name("schema.json")

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class RunFileError(ValueError):
    """A run file that is unreadable, of an unknown schema version, or invalid (one line)."""


class SchemaUnavailable(RunFileError):
    """The schema cannot be checked here (jsonschema is missing): the file itself may be fine."""


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _validator() -> Any:
    """A validator of the schema with its `$defs` written in place: resolving a `$ref` through
    jsonschema's registry on every record made validation 2x slower (measured on a 300-record run)."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema())
    return cls(_inline_refs(schema(), schema().get("$defs", {})))


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    """`node` with every local `#/$defs/NAME` reference replaced by its definition (the schema has no
    recursive definition); a reference beside other keywords becomes an `allOf` member."""
    if isinstance(node, list):
        return [_inline_refs(v, defs) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _inline_refs(v, defs) for k, v in node.items() if k not in ("$defs", "$ref")}
    ref = node.get("$ref")
    if ref is None:
        return out
    if not (isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] in defs):
        raise RunFileError(f"schema: unsupported reference {ref!r}")
    target = _inline_refs(defs[ref[8:]], defs)
    if not out:
        return target
    out["allOf"] = [*out.get("allOf", []), target]
    return out


def encode(obj: Any) -> Any:
    """Return a strict-JSON copy of obj: non-finite floats become strings, NumPy scalars,
    tuples and Paths become plain JSON values."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, dict):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if type(obj).__module__ == "numpy" and hasattr(obj, "tolist"):
        return encode(obj.tolist())
    raise RunFileError(f"cannot store a {type(obj).__name__} in a run file: {obj!r:.80}")


def _decode_numbers(obj: Any, key: str | None = None) -> Any:
    """Undo `encode` for the fields the schema types as numbers."""
    if isinstance(obj, dict):
        return {k: _decode_numbers(v, k) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode_numbers(v, key) for v in obj]
    if isinstance(obj, str) and key in _NUMERIC_KEYS and obj in _NONFINITE:
        return _NONFINITE[obj]
    return obj


_NUMERIC_KEYS = frozenset({"max", "mean", "ratio_max", "ratio_mean", "allowance", "duration_s"})


def _where(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _one_line(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def validate(obj: Any, source: str = "run file") -> None:
    """Raise RunFileError (one line) unless obj is a valid run file of a known schema version."""
    if not isinstance(obj, dict):
        raise RunFileError(f"{source}: not a JSON object")
    version = obj.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RunFileError(
            f"{source}: unsupported schema_version {version!r} (this reader knows {SCHEMA_VERSION})"
        )
    try:
        import jsonschema
    except ImportError:
        raise SchemaUnavailable(f"{source}: cannot be validated: jsonschema is not installed "
                                "(pip install jsonschema)") from None

    data = encode(obj)
    error = jsonschema.exceptions.best_match(_validator().iter_errors(data))
    if error is not None:
        raise RunFileError(_one_line(f"{source}: {_where(error.absolute_path)}: {error.message}"))
    _check_consistency(data, source)


def _check_consistency(data: dict[str, Any], source: str) -> None:
    """Cross-field rules JSON Schema cannot express."""
    if "divergences" not in data:
        return
    known = {d["id"] for d in data["divergences"]}
    for i, rec in enumerate(data["records"]):
        for div in rec.get("divergences", []):
            if div not in known:
                raise RunFileError(
                    f"{source}: records[{i}].divergences: {div!r} is not in the run's divergences"
                )


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate one run file; non-finite numbers come back as floats."""
    source = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise RunFileError(f"{source}: cannot read: {exc.strerror or exc}") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunFileError(f"{source}: not JSON: {exc.msg} at line {exc.lineno}") from None
    validate(obj, source)
    return _decode_numbers(obj)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write(path: str | os.PathLike[str], obj: dict[str, Any], *, check: bool = True) -> Path:
    """Validate obj (unless check is False) and write it atomically (temporary file in the same folder,
    then rename)."""
    target = Path(path)
    if check:
        validate(obj, os.fspath(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(encode(obj), indent=1, allow_nan=False, ensure_ascii=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a run file is an ordinary file
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
