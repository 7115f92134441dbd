import sys

from bucketsearch.cli import main

sys.exit(main())
