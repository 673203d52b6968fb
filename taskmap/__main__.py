"""``python -m taskmap ...`` runs the command line (see taskmap.cli)."""

import sys

from taskmap.cli import main

sys.exit(main())
