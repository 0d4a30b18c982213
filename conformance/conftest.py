"""Stop-gap (jaxeco branch): register the regions and witnesses that spec/divergences/flax.toml and
equinox.toml name, before the plugin loads the divergence files (pytest loads this conftest with the
initial conftests of `pytest conformance ...`, before pytest_configure). The lead is to replace it by
importing these modules from conformance/regions.py and conformance/witnesses.py."""
from attnconf.conformance import regions_flax, witnesses_flax  # noqa: F401
