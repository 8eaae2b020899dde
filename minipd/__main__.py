"""`python -m minipd ...` is the `minipd` command."""

import sys

from minipd.entrypoints.cli import main

sys.exit(main())
