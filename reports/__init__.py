"""attnconf reports: read run files and turn them into a conformance matrix and certificates.

Data flows one way: the pytest plugin writes one run file per run (`reports.runfile.write`);
everything here only reads run files and the spec (titles, divergence entries). Nothing in this
package imports `conformance` or `adapters`, so a report can be rebuilt anywhere from the JSON.

CLI: `python -m reports merge --out DIR RUN.json...` and `python -m reports validate RUN.json...`.
"""

from __future__ import annotations

from attnconf.reports.runfile import SCHEMA_VERSION, RunFileError, load, validate, write

__all__ = ["SCHEMA_VERSION", "RunFileError", "load", "validate", "write"]
