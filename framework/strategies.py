"""`trainer.strategy=fsdp2`: Lightning's FSDP2 strategy under a name, and how the framework's modules shard.

Lightning runs FSDP2 (`torch.distributed.fsdp.fully_shard`) through `ModelParallelStrategy`, which has no registry
name and asks the LightningModule to shard itself in `configure_model()`. `FSDP2Strategy` is that strategy with
the defaults a data-parallel run wants (every process in one data-parallel group, no tensor parallelism, the
checkpoint gathered into one file on rank 0, so resume, the checkpoint checks and Hub pushes treat it as any other
run), registered in Lightning's strategy registry as `fsdp2` when `framework.strategies` is imported (the CLI
imports it). `shard(model, mesh)` is the sharding the framework's modules apply: each transformer block (or the
children of any `blocks`/`layers` list) is one FSDP unit, then the rest of the model.

Outside the framework: `Trainer(strategy=FSDP2Strategy())`, or `strategy="fsdp2"` after importing this module,
with a LightningModule whose `configure_model()` calls `shard(self.model, self.device_mesh["data_parallel"])`.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from torch import nn

NAME = "fsdp2"
#: methods besides `forward` through which a model is called (timm's classifier interface)
FORWARD_METHODS = ("forward_features", "forward_head")


class FSDP2Strategy(ModelParallelStrategy):
    """`ModelParallelStrategy` for data-parallel FSDP2 (`fully_shard`); tensor parallelism is off. Other keyword
    arguments go to Lightning's `ModelParallelStrategy`.

    Args:
        data_parallel_size: processes the model is sharded over; "auto": every process (nodes × processes per node).
        tensor_parallel_size: must be 1: the framework's modules shard for data parallelism only.
        save_distributed_checkpoint: write a folder of per-rank shards; False: one full file gathered on rank 0.
            `python -m framework.train ckpt_path=` checks and resumes from the full file only.
    """

    def __init__(self, data_parallel_size: Any = "auto", tensor_parallel_size: Any = 1,
                 save_distributed_checkpoint: bool = False, **kwargs: Any) -> None:
        if tensor_parallel_size != 1:
            raise ValueError(f"tensor_parallel_size={tensor_parallel_size!r}: the framework's modules shard for data "
                             f"parallelism only (FSDP2); valid: 1")
        super().__init__(data_parallel_size=data_parallel_size, tensor_parallel_size=1,
                         save_distributed_checkpoint=save_distributed_checkpoint, **kwargs)

    def setup_environment(self) -> None:
        if self._data_parallel_size == "auto":
            self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()


def register() -> None:
    """Put `fsdp2` in Lightning's strategy registry (idempotent; a name Lightning itself defines is kept)."""
    if NAME not in StrategyRegistry:
        StrategyRegistry.register(NAME, FSDP2Strategy,
                                  description="FSDP2 (fully_shard) data parallelism; the framework's modules shard "
                                              "themselves in configure_model()")


def is_sharded(module: nn.Module) -> bool:
    """Whether `fully_shard` has been applied to `module` itself."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def reshard(module: nn.Module) -> None:
    """Put every FSDP2 unit in `module` back in its sharded state (a no-op for a module that is not sharded). FSDP2
    keeps a root's weights gathered after a forward with no backward (evaluation), so a copy that is only ever
    evaluated, like an EMA, is resharded before its weights are updated shard by shard."""
    from torch.distributed.fsdp import FSDPModule

    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            sub.reshard()


#: names of the list that holds a model's transformer blocks: ours (`blocks`), transformers' decoders (`layers`),
#: BERT-style encoders (`layer`), GPT-2 (`h`)
BLOCK_LISTS = ("blocks", "layers", "layer", "h")


def units(model: nn.Module) -> list[nn.Module]:
    """The submodules that become their own FSDP unit: the entries of the model's block list, the shallowest list
    named in `BLOCK_LISTS` (`model.blocks`; a Hugging Face model's `hf.model.layers` or `hf.bert.encoder.layer`)."""
    for attr in ("blocks", "layers"):
        found = getattr(model, attr, None)
        if isinstance(found, nn.ModuleList | nn.Sequential):
            return list(found)
    for name, module in model.named_modules():
        if name and name.rsplit(".", 1)[-1] in BLOCK_LISTS and isinstance(module, nn.ModuleList) and len(module):
            return list(module)
    return []


def shard(model: nn.Module, mesh: Any) -> nn.Module:
    """`fully_shard` each of `units(model)`, then `model` itself, on the 1-D `mesh`; a model already sharded is
    returned as it is (Lightning calls `configure_model` again for each validate/fit/test)."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    if is_sharded(model):
        return model
    if mesh.ndim != 1:
        raise ValueError(f"shard() takes a 1-D data-parallel mesh, got {mesh.ndim} dims {mesh.mesh_dim_names}")
    for unit in units(model):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for name in FORWARD_METHODS:  # timm-style models are also called through these, not only `forward`
        if callable(getattr(model, name, None)):
            register_fsdp_forward_method(model, name)
    return model


def unshardable(lm: Any) -> str | None:
    """Why the LightningModule `lm` cannot train under `trainer.strategy=fsdp2`, or None when it can: it must name
    the modules it shards (`sharded_modules()`, as the framework's `TrainModule` does) and train nothing outside
    them (FSDP2 synchronises only what it shards: anything else would train apart on each rank)."""
    modules = getattr(lm, "sharded_modules", None)
    if not callable(modules):
        return (f"module {type(lm).__name__} does not shard itself for FSDP2 (it trains nothing of its own); use "
                f"trainer.strategy=ddp to split it across processes")
    inside = {id(p) for m in modules() for p in m.parameters()}
    outside = [n for n, p in lm.named_parameters() if p.requires_grad and id(p) not in inside]
    if outside:
        return (f"module {type(lm).__name__} trains parameters outside the model FSDP2 shards ({', '.join(outside[:3])}"
                f"{', ...' if len(outside) > 3 else ''}), which FSDP2 would not synchronise; use trainer.strategy=ddp")
    return None


register()
