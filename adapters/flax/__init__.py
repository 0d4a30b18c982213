"""The `flax` backend pack: `flax.linen.dot_product_attention` and `flax.linen.MultiHeadDotProductAttention`.

The adapter module is adapter.py; importing the pack imports no framework (attnconf.adapters.pack).
"""
from attnconf.adapters.pack import face

__getattr__ = face(__name__)
