"""Lightning callbacks, each usable on its own in any Lightning project (`from framework.callbacks.hub_push import
HubPush`): no Hydra, no catalog, no side effects on import."""
