"""The `torch` backend pack: SDPA with each backend forced, flex_attention, nn.MultiheadAttention.

The adapter module is adapter.py; importing the pack imports no framework (attnconf.adapters.pack).
"""
from attnconf.adapters.pack import face

__getattr__ = face(__name__)
