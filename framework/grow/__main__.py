"""`python -m framework.grow SOURCE --depth 2 --width 2 --out DIR` (see framework.grow.cli)."""

from framework.grow.cli import main

raise SystemExit(main())
