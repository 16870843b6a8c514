"""Lightning strategies of our own: `trainer.strategy=fsdp2` (Lightning's registry holds it too, once
`framework.strategies` is imported, so the name works in any Lightning project)."""

from framework.registry import STRATEGIES
from framework.strategies import NAME, FSDP2Strategy

STRATEGIES.register(
    FSDP2Strategy, name=NAME,
    description="FSDP2 (fully_shard) data parallelism, block by block; the checkpoint gathered into one file",
)
