"""``python -m kvviz`` entry point."""

import sys

from kvviz.cli import main

sys.exit(main())
