"""`recipe=sft` with `peft=lora` and `model.gradient_checkpointing=true` under Lightning's strategies, 2 CPU processes
(gloo), through the CLI: DDP ends where one process with the same global batch ends, and FSDP2 (each decoder layer
its own unit, the frozen base and the adapters in the same units) ends where DDP ends."""

from __future__ import annotations

import pytest
import torch
from helpers import finish, start_cli
from support.stand_ins import serve_chat

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def env(hub, tmp_path_factory):
    serve_chat(hub.api)
    return {"HF_ENDPOINT": hub.url, "HF_TOKEN": "dummy", "HF_HOME": str(tmp_path_factory.mktemp("hf_home"))}


ARGS = ["recipe=sft", "peft=lora", "peft.dropout=0", "model.gradient_checkpointing=true", "optimizer=adamw",
        "optimizer.lr=1e-3", "threads=1", "trainer.max_steps=3", "trainer.val_check_interval=null",
        "trainer.limit_val_batches=0", "validate_before_fit=false", "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false"]


def adapters(run) -> dict[str, torch.Tensor]:
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    return {k: v for k, v in state.items() if "lora_" in k}


@pytest.mark.ddp
@pytest.mark.slow  # three 2-process or 1-process CLI runs (~60 s); make test runs recipe=sft + peft=lora in one process
def test_lora_with_checkpointing_under_ddp_and_fsdp2_ends_where_one_process_ends(env, tmp_path):
    """One process with batch 4, DDP with 2 per rank, FSDP2 with 2 per rank: the same global batches, so the
    adapters end within float rounding of each other (AdamW); the adapters moved from their start."""
    runs = {}
    for name, extra in (("one", ["data.batch_size=4", "trainer.devices=1"]),
                        ("ddp", ["data.batch_size=2", "trainer.devices=2", "trainer.strategy=ddp"]),
                        ("fsdp2", ["data.batch_size=2", "trainer.devices=2", "trainer.strategy=fsdp2"])):
        code, err = finish(start_cli([*ARGS, *extra, f"hydra.run.dir={tmp_path / name}"], env=env))
        assert code == 0, f"{name}: {err[-3000:]}"
        runs[name] = adapters(tmp_path / name)
    one = runs["one"]
    assert one and all(k.endswith(("lora_A.default.weight", "lora_B.default.weight")) for k in one)
    assert max(v.abs().max().item() for k, v in one.items() if "lora_B" in k) > 1e-4  # B starts at 0: it trained
    for name in ("ddp", "fsdp2"):
        assert runs[name].keys() == one.keys(), name
        gap = max((runs[name][k] - one[k]).abs().max().item() for k in one)
        assert gap < 1e-5, (name, gap)
