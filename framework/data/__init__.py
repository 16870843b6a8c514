"""LightningDataModules: the data users bring (text, chat, images) and the generated tasks (needle, kv_recall, ...)."""
