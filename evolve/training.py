"""One training step of a run's policy on its own archive: load recent groups, update, save, record, publish.

Shared by `evolve train` (offline) and `evolve run --train-every N` (online). A failed step restores the
adapter weights it started from, so the policy keeps serving the version it had.
"""

from __future__ import annotations

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

    def _current_version_id(self) -> int | None:
        rows = [v for v in self.archive.policy_versions(self.run_id) if v.number == self.policy.version]
        return rows[-1].id if rows else None

    def step(self) -> UpdateStats:
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        versions = recent_version_ids(self.archive, self.run_id, self.config.versions_back)
        batch = load_batch(self.archive, self.run_id, self.components, self.variants, versions, self.max_groups)
        before = {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.trainer.model).items()}
        try:
            stats = self.trainer.update(batch.groups, dict(batch.skipped))
            if stats.samples == 0:
                return stats
            number = self.policy.version + 1
            directory = self.trainer.save(self.adapters_dir / f"v{number}")
            self.archive.add_policy_version(
                run_id=self.run_id,
                base_model=self.policy.name,
                adapter_path=str(directory),
                parent_id=self._current_version_id(),
                number=number,
                train_config=self.config.as_dict(),
                stats=asdict(stats),
            )
            self.policy.publish(directory, number)
            return stats
        except Exception:
            set_peft_model_state_dict(self.trainer.model, before)
            raise


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
