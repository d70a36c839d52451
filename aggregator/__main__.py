"""`python -m aggregator` runs the `hypertopo-aggregator` command line."""

import sys

from aggregator.cli import main

sys.exit(main())
