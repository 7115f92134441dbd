import sys

from bucketsearch.loadtest.cli import main

if __name__ == "__main__":  # spawned client processes re-import this module as __mp_main__
    sys.exit(main())
