"""`python -m framework.hub push|pull ...` (see framework.hub.cli)."""

from framework.hub.cli import main

raise SystemExit(main())
