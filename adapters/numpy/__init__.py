"""The `numpy` backend pack: the float64 reference as an implementation, and NumPy kernels.

The adapter module is adapter.py; importing the pack imports no framework (attnconf.adapters.pack).
"""
from attnconf.adapters.pack import face

__getattr__ = face(__name__)
