"""The `jax` backend pack: `jax.nn.dot_product_attention` (xla and cudnn) and flax's MultiHeadAttention.

The adapter module is adapter.py; importing the pack imports no framework (attnconf.adapters.pack).
"""
from attnconf.adapters.pack import face

__getattr__ = face(__name__)
