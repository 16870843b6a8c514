"""The local Hub server is product code now, `framework.local_hub`; tests keep importing it as `support.local_hub`."""

from framework.local_hub import LocalHub, main, patch_client

__all__ = ["LocalHub", "main", "patch_client"]
