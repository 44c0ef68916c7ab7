"""``python -m kvviz`` entry point."""

import sys

from kvviz.cli import main

if __name__ == "__main__":  # not when a sweep's spawned worker imports this module
    sys.exit(main())
