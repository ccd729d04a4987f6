"""One training step of a run's policy on its own archive: load recent groups, update, save, publish, record.

Shared by `evolve train` (offline) and `evolve run --train-every N` (online). A step is a transaction: the
version row, its adapter directory, the served weights and the optimizer state change together or not at all.
The adapter is written under a staging name and renamed into place, published, and only then recorded; a failure
anywhere restores the adapter weights and optimizer state it started from, removes the directory, and serves the
previous version again, so the only trace is the failure the loop counts.
"""

from __future__ import annotations

import copy
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from evolve.archive import Archive
from evolve.problem.config import ComponentSpec
from policies.groups import load_batch, recent_version_ids
from policies.trainer import PolicyTrainer, TrainConfig, UpdateStats


class TrainingUnsupported(Exception):
    pass


class OnlineTrainer:
    def __init__(
        self,
        archive: Archive,
        run_id: int,
        components: list[ComponentSpec],
        variants: int,
        policy: Any,
        config: TrainConfig,
        adapters_dir: Path,
        max_groups: int = 64,
        trainer_model: str | None = None,
    ) -> None:
        """`policy` serves and receives each new version. The weights trained are its own when it runs in this
        process, else a local copy of the same base model loaded from `trainer_model`."""
        if not hasattr(policy, "publish"):
            raise TrainingUnsupported(f"policy {policy.name!r} cannot load new adapters")
        self.archive, self.run_id, self.components, self.variants = archive, run_id, components, variants
        self.policy, self.config, self.adapters_dir, self.max_groups = policy, config, adapters_dir, max_groups
        local = policy if hasattr(policy, "model") else None
        if local is None:
            if not trainer_model:
                raise TrainingUnsupported(
                    f"policy {policy.name!r} is served elsewhere: pass --trainer-model with the served base "
                    "model's directory or hub id"
                )
            from policies.transformers_policy import TransformersPolicy

            local = TransformersPolicy.load(trainer_model)
        self.trainer = PolicyTrainer(local.model, local.tokenizer, local.render, config)
        local.model = self.trainer.model  # an in-process policy samples from the adapter-wrapped model

    def _versions(self) -> list[Any]:
        return sorted(self.archive.policy_versions(self.run_id), key=lambda v: v.number)

    def step(self) -> UpdateStats:
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        versions = recent_version_ids(self.archive, self.run_id, self.config.versions_back)
        batch = load_batch(self.archive, self.run_id, self.components, self.variants, versions, self.max_groups)
        weights = {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.trainer.model).items()}
        optimizer = copy.deepcopy(self.trainer.optimizer.state_dict())
        serving = self.policy.version
        rows = self._versions()
        current = next((v for v in reversed(rows) if v.number == serving), None)
        number = max([serving, *(v.number for v in rows)]) + 1  # never reuses a number, even one left by a crash
        directory, published = self.adapters_dir / f"v{number}", False
        try:
            stats = self.trainer.update(batch.groups, dict(batch.skipped))
            if stats.samples == 0:
                return stats
            self._save_into(directory)
            self.policy.publish(directory, number)
            published = True
            self.archive.add_policy_version(
                run_id=self.run_id,
                base_model=self.policy.name,
                adapter_path=str(directory),
                parent_id=None if current is None else current.id,
                number=number,
                train_config=self.config.as_dict(),
                stats=asdict(stats),
            )
            return stats
        except BaseException:
            set_peft_model_state_dict(self.trainer.model, weights)
            self.trainer.optimizer.load_state_dict(optimizer)
            if published:
                self._serve_again(serving, None if current is None else current.adapter_path)
            shutil.rmtree(directory, ignore_errors=True)
            raise

    def _save_into(self, directory: Path) -> None:
        """Write under a staging name, then rename: `vN/` is either absent or a complete adapter."""
        staging = directory.with_name(directory.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        self.trainer.save(staging)
        shutil.rmtree(directory, ignore_errors=True)  # a crash's leftover: no version row refers to it
        staging.rename(directory)

    def _serve_again(self, number: int, adapter_path: str | None) -> None:
        """Undo a publish whose version could not be recorded."""
        if adapter_path:
            self.policy.publish(adapter_path, number)
            return
        # back to the base model: in-process weights were restored above; a server's requests name the base again
        if hasattr(self.policy, "served"):
            self.policy.served = None
        self.policy.version = number


def restore_latest_adapter(archive: Archive, run_id: int, policy: Any) -> int | None:
    """On resume, serve the newest trained version again; returns its number (None when there is none)."""
    trained = [v for v in archive.policy_versions(run_id) if v.adapter_path]
    if not trained or not hasattr(policy, "publish"):
        return None
    latest = max(trained, key=lambda v: v.number)
    if Path(latest.adapter_path).is_dir():
        policy.publish(latest.adapter_path, latest.number)
        return latest.number
    return None
