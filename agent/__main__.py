"""`python -m agent` is `hypertopo-agent` (handy where the console script is not on PATH)."""

from agent.cli import main

raise SystemExit(main())
