"""In a checkout, load the attnconf pytest plugin (an installed attnconf loads it by its pytest11 entry point,
registered under the same name, so it is never loaded twice)."""
pytest_plugins = ["attnconf.conformance.plugin"]

# Stop-gap (jaxeco branch): register the regions and witnesses that spec/divergences/flax.toml and
# equinox.toml name before any divergence file is loaded (by the plugin or by tests/). To be replaced
# by importing these two modules from conformance/regions.py and conformance/witnesses.py.
import attnconf.conformance.regions_flax  # noqa: E402, F401
import attnconf.conformance.witnesses_flax  # noqa: E402, F401
