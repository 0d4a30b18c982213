"""The engine: pytest plugin hooks, run state, the call path into a kernel, scope, judge, tolerance,
divergences and verdicts. The suite (conformance/test_*.py) states the spec through it."""
