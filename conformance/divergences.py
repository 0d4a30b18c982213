"""Which declared divergence (spec/divergences/<backend>.toml) a case falls under.

Entries are loaded and validated by `spec.load_divergences`; this module only
matches an (implementation, case, device) against them.
"""
from __future__ import annotations

from fnmatch import fnmatch
from typing import Any

from attnconf.reference import Case

from .regions import REGIONS
from .witnesses import WITNESSES


class Divergences:
    def __init__(self, entries: list[dict[str, Any]], device: str):
        for e in entries:
            if e["region"] not in REGIONS:
                raise ValueError(f"{e['file']}: entry {e['id']!r}: field 'region': unknown region {e['region']!r}; "
                                 f"known: {', '.join(sorted(REGIONS))}")
            if e["witness"] not in WITNESSES:
                raise ValueError(f"{e['file']}: entry {e['id']!r}: field 'witness': unknown witness {e['witness']!r}; "
                                 f"known: {', '.join(sorted(WITNESSES))}")
        self.entries = entries
        self.device = device

    def for_impl(self, impl_name: str) -> list[dict[str, Any]]:
        return [e for e in self.entries
                if any(fnmatch(impl_name, pat) for pat in e["implementations"])
                and (not e["devices"] or self.device in e["devices"])]

    def match(self, impl_name: str, case: Case, *, gradients: bool = False) -> dict[str, Any] | None:
        """The first entry whose implementation, device, dtype, scope and region cover the case."""
        for e in self.for_impl(impl_name):
            if e["dtypes"] and case.dtype not in e["dtypes"]:
                continue
            if e["scope"] == ("forward" if gradients else "gradients"):
                continue
            try:
                inside = REGIONS[e["region"]](case)
            except Exception:  # a predicate that cannot judge this case (e.g. invalid shapes) does not cover it
                inside = False
            if inside:
                return e
        return None
