"""Loads the attnconf plugin for `pytest conformance ...` (all plumbing is in plugin.py)."""
from conformance.plugin import *  # noqa: F401,F403
from conformance.plugin import (pytest_addoption, pytest_collection_modifyitems, pytest_configure,  # noqa: F401
                                pytest_generate_tests, pytest_report_teststatus, pytest_runtest_call,
                                pytest_runtest_logreport, pytest_runtest_makereport, pytest_sessionfinish,
                                pytest_sessionstart, pytest_terminal_summary)
