"""`python -m attnconf ...`: the same as the `attnconf` command (attnconf/cli.py)."""
import sys

from attnconf.cli import main

sys.exit(main())
