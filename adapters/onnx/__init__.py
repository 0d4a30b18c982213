"""The `onnx` backend pack: ONNX attention operators run by ONNX Runtime (CPU) and by onnx's reference evaluator.

The adapter module is adapter.py; importing the pack imports no framework (attnconf.adapters.pack).
"""
from attnconf.adapters.pack import face

__getattr__ = face(__name__)
