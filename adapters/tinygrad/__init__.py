"""The `tinygrad` backend pack: `Tensor.scaled_dot_product_attention` on tinygrad's CPU device.

The adapter module is adapter.py; importing the pack imports no framework (attnconf.adapters.pack).
"""
from attnconf.adapters.pack import face

__getattr__ = face(__name__)
