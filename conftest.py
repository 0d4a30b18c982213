"""In a checkout, load the attnconf pytest plugin (an installed attnconf loads it by its pytest11 entry point,
registered under the same name, so it is never loaded twice)."""
pytest_plugins = ["attnconf.conformance.engine.plugin"]
