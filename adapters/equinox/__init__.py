"""The `equinox` backend pack: `equinox.nn.MultiheadAttention` and the per-head function it calls.

The adapter module is adapter.py; importing the pack imports no framework (attnconf.adapters.pack).
"""
from attnconf.adapters.pack import face

__getattr__ = face(__name__)
