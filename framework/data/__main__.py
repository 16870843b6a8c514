"""`python -m framework.data prepare ...`: build the data cache ahead of a job (see framework.data.prepare)."""

from framework.data.prepare import main

raise SystemExit(main())
