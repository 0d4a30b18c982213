"""The `transformers` backend pack: Hugging Face transformers' attention functions, called as its models call them.

The adapter module is adapter.py; importing the pack imports no framework (attnconf.adapters.pack).
"""
from attnconf.adapters.pack import face

__getattr__ = face(__name__)
