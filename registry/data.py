"""DataModules: everything ships with Python or a package, or is generated; nothing is downloaded."""

from framework.data.text import ByteCorpus
from framework.registry import DATA

DATA.register(ByteCorpus, name="byte_corpus", source="pydoc", seq_len=128, batch_size=32, seed=None)
