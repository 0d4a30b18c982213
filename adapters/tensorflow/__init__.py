"""The `tensorflow` backend pack: Keras 3 attention on the TensorFlow runtime.

The adapter module is adapter.py; importing the pack imports no framework (attnconf.adapters.pack).
"""
from attnconf.adapters.pack import face

__getattr__ = face(__name__)
