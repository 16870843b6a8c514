"""`python -m framework.local_hub --root DIR [--port 8765]` (see framework.local_hub.server.main)."""

from framework.local_hub.server import main

raise SystemExit(main())
