"""`HubPush`: publish the model to the Hugging Face Hub at the end of fit and, optionally, every N validations.

A failed push never stops training and never loses anything: it logs a warning with the exact command that
retries the push from the run dir, and training goes on. Works in any Lightning project whose LightningModule
holds a framework model (`.model` with `.init_config`), a timm model, or saved its hyperparameters
(`self.save_hyperparameters()`); any other module is refused when the fit starts, before step 1. The catalog
(with Hydra) is not imported when `info` names a framework model (`info={"model_name": "transformer_lm"}`).
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

log = logging.getLogger(__name__)


class HubPush(L.Callback):
    """Push `pl_module` to `repo_id` (branch `revision`) as one commit per push; rank 0 only.

    `model_attr` and `model_config` in `info` push a sub-model in the plain format with the constructor values given
    (for a module that receives its net already built). `pushes` and `failures` record what happened.

    Args:
        repo_id: Hub repository "namespace/name" to push to (created if missing); required by the time fit starts.
        revision: branch to commit to (created if missing); None: main.
        private: create the repository as private (an existing one keeps its visibility).
        every_n_validations: also push after every N-th validation during fit; 0: only at the end.
        push_at_end: push when fit ends; False leaves the final push to the caller (`framework.train` does its own).
        info: model card details (`recipe`, `command`, `datasets`, `task`, `model_name`, timm's `label_names`, ...).
            A timm model's `label_names` default to the data module's `classes`.
    """

    def __init__(
        self,
        repo_id: str | None = None,
        revision: str | None = None,
        private: bool = False,
        every_n_validations: int = 0,
        push_at_end: bool = True,
        info: dict[str, Any] | None = None,
    ):
        super().__init__()
        if int(every_n_validations) < 0:
            raise ValueError(f"every_n_validations={every_n_validations} must be >= 0 (0: only at the end of fit)")
        if repo_id:
            from framework.hub import check_repo_id

            check_repo_id(repo_id)
        self.repo_id, self.revision, self.private = repo_id, revision, bool(private)
        self.every_n_validations, self.push_at_end = int(every_n_validations), bool(push_at_end)
        self.info = dict(info or {})
        self.pushes: list[Any] = []  # framework.hub.Pushed, one per successful push
        self.failures: list[str] = []
        self._validations = 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Refuse, before step 1, a fit whose module could not be pushed at its end (one-line ValueError)."""
        if not self.repo_id:  # fail before training, not after it
            raise ValueError("HubPush needs repo_id='namespace/name' (e.g. `callbacks.hub_push.repo_id=me/model`)")
        if stage == "fit":
            from framework.hub import NotPushableError, pushable

            try:
                pushable(pl_module, self.info)
            except NotPushableError as err:
                raise NotPushableError(f"HubPush({self.repo_id!r}) refuses to start the fit: {err}") from None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit" or not self.every_n_validations:
            return
        self._validations += 1
        if self._validations % self.every_n_validations == 0:
            self.push(trainer, pl_module, f"validation {self._validations}, step {trainer.global_step}")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.push_at_end:
            self.push(trainer, pl_module, f"end of fit, step {trainer.global_step}")

    def retry_command(self, trainer: L.Trainer) -> str:
        """The command that pushes the run dir (its last checkpoint) again once the run has finished."""
        cmd = f"python -m framework.hub push {shlex.quote(str(Path(trainer.default_root_dir).resolve()))}"
        cmd += f" {shlex.quote(str(self.repo_id))}"
        return cmd + (f" --revision {shlex.quote(self.revision)}" if self.revision else "") + (
            " --private" if self.private else "")

    @rank_zero_only
    def push(self, trainer: L.Trainer, pl_module: L.LightningModule, why: str) -> None:
        """Push now; on any failure, warn with the retry command and return (training continues)."""
        from framework.hub import push_to_hub

        try:
            pushed = push_to_hub(pl_module, str(self.repo_id), self.revision, self.private,
                                 commit_message=f"HubPush: {why}", info=self.info)
        except Exception as err:
            message = (
                f"HubPush: pushing to {self.repo_id!r} at {why} failed ({type(err).__name__}: {err}). Training goes"
                f" on and nothing on disk is lost; once the run has finished, retry with: {self.retry_command(trainer)}"
            )
            self.failures.append(message)
            log.warning(message)
            return
        self.pushes.append(pushed)
        log.info("HubPush: pushed %s to %s (commit %s)", why, pushed.repo_id, pushed.commit)
