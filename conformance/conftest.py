"""Loads the attnconf plugin for `pytest conformance ...` (all plumbing is in plugin.py)."""
from conformance.plugin import *  # noqa: F401,F403  (pytest finds the hooks by name)
