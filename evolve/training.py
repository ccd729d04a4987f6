"""One training step of a run's policy on its own archive: load recent groups, update, save, publish, record.

Shared by `evolve train` (offline) and `evolve run --train-every N` (online). A step is a transaction: the
version row, its adapter directory, the served weights and the optimizer state change together or not at all.
The adapter is written under a staging name and renamed into place, published, and only then recorded; a failure
anywhere (an update given up because the run is stopping, `UpdateAbandoned`, too) restores the adapter weights
and optimizer state it started from, removes the directory, and serves the previous version again, so the only
trace is the failure the loop counts (or the stop reason, for an abandoned update). The training data is read
here, in the engine, so that `policies/` knows nothing of the archive.
"""

from __future__ import annotations

import copy
import shutil
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from evolve.archive import Archive, PolicyVersionRecord
from evolve.archive.group_store import StoredCompletion
from evolve.fitness import oriented_array, oriented_bounds
from evolve.problem.config import ComponentSpec
from policies.optimizer_state import drop_optimizer
from policies.policy import InProcessPolicy, Policy, PublishingPolicy, TrainsAsTransformers
from policies.trainer import PolicyTrainer, ShouldStop, TrainConfig, UpdateStats, never
from policies.training_groups import Batch, TrainingCompletion, TrainingGroup, normalise


class TrainingUnsupported(Exception):
    pass


# Which of the loaded groups one step trains on (all of them when none is given): an offline experiment on a
# fixed archive trains each step on its own slice (benchmarks/improve_at_k.py), so that a step costs a few groups
# of updates, as an online step does, rather than a pass over every group the archive holds.
GroupPick = Callable[[list[TrainingGroup]], list[TrainingGroup]]


def member_versions(archive: Archive, run_id: int, member: str | None, first: bool = True) -> list[PolicyVersionRecord]:
    """A member's version lineage by number (`member` None: every version of the run, as before ensembles);
    rows that name no member are the first member's."""
    return sorted(archive.policy_versions(run_id, member, with_unnamed=first), key=lambda v: v.number)


def recent_version_ids(
    archive: Archive, run_id: int, versions_back: int, member: str | None = None, first: bool = True
) -> list[int]:
    """Row ids of the member's newest policy version and the `versions_back` before it: so that a member is
    trained only on the groups it sampled itself."""
    versions = member_versions(archive, run_id, member, first)
    if not versions:
        return []
    newest = versions[-1].number
    return [v.id for v in versions if v.number >= newest - versions_back]


def load_batch(
    archive: Archive,
    run_id: int,
    components: Sequence[ComponentSpec],
    m: int,
    version_ids: Sequence[int],
    max_groups: int | None = None,
) -> Batch:
    """Groups of the given policy versions, newest first, normalised; skipped groups counted by reason.

    Completions without token ids or logprobs (from some OpenAI-compatible servers) cannot be trained on
    and are refused, counted under that reason. Answers that gave no new valid program (copies, unparseable or
    missing, failed) are marked wasted: zero rows, unless the training config's lazy penalty puts them below.
    Each group carries its parent's vector, read with the groups' prompts in the same query (so the work is the
    batch's, whatever the archive's size), and each valid child that scored exactly as that parent is marked
    unchanged: the reward for improvement (policies/shaping.py) measures gains against the parent.
    """
    batch = Batch()
    rows = archive.group_rows(run_id, version_ids, max_groups)
    by_completion: dict[int, np.ndarray] = {c.id: np.full((m, len(components)), np.nan) for c in rows.completions}
    for a in rows.answers:
        if a.status == "ok" and a.scores is not None and a.error_kind is None and a.slot < m:
            by_completion[a.completion_id][a.slot] = oriented_array(components, a.scores)
    grouped: dict[int, list[StoredCompletion]] = defaultdict(list)
    for c in rows.completions:
        grouped[c.prompt_id].append(c)
    for prompt in rows.prompts:
        parent = parent_vector(components, prompt.parent_scores)
        trainable = []
        for c in grouped[prompt.id]:
            ids, lps = c.token_id_list(), c.logprob_list()
            if not ids or not lps or len(ids) != len(lps):
                batch.skipped["completion without token ids or logprobs"] += 1
                continue
            answers = by_completion[c.id]
            wasted = np.isnan(answers).any(axis=1)  # no new valid program in that slot
            unchanged = ~wasted & (answers == parent).all(axis=1) if parent is not None else None
            trainable.append(TrainingCompletion(c.id, ids, lps, c.temperature, answers, wasted, unchanged))
        if len(trainable) < 2:
            batch.skipped["fewer than 2 scored completions"] += 1
            continue
        batch.groups.append(TrainingGroup(prompt.id, prompt.text, trainable, parent))
    normalise(batch.groups, oriented_bounds(components))
    return batch


def parent_vector(components: Sequence[ComponentSpec], scores: dict[str, float] | None) -> np.ndarray | None:
    """A parent's oriented (D,) vector, as its children's are read (a missing component scores its fail value),
    or None when it has no valid evaluation."""
    if scores is None:
        return None
    vector = oriented_array(components, scores)
    return None if np.isnan(vector).any() else vector


class ArchiveTrainer:
    """Trains a run's policy on the groups in its own archive, online (`evolve run`) or offline (`evolve train`)."""

    def __init__(
        self,
        archive: Archive,
        run_id: int,
        components: list[ComponentSpec],
        variants: int,
        policy: Policy,
        config: TrainConfig,
        adapters_dir: Path,
        max_groups: int = 64,
        trainer_model: str | None = None,
        member: str | None = None,
        first: bool = True,
    ) -> None:
        """`policy` serves and receives each new version. The weights trained are its own when it runs in this
        process with transformers, else a local copy of the same base model loaded from `trainer_model` (a
        llama.cpp policy names its own). The trainer's importance weight then corrects for the two runtimes'
        numerics: the sampler's stored logprobs are the behaviour policy (see policies/trainer.py)."""
        if not isinstance(policy, PublishingPolicy):
            raise TrainingUnsupported(f"policy {policy.name!r} cannot load new adapters")
        self.publisher: PublishingPolicy = policy
        self.member, self.first = member, first  # whose lineage this trainer extends (None: the run's only one)
        self.archive, self.run_id, self.components, self.variants = archive, run_id, components, variants
        self.policy, self.config, self.adapters_dir, self.max_groups = policy, config, adapters_dir, max_groups
        local: InProcessPolicy | None = policy if isinstance(policy, InProcessPolicy) else None
        if local is None and not trainer_model and isinstance(policy, TrainsAsTransformers):
            trainer_model = policy.trainer_model
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
        self._train_on_from_latest()

    def _train_on_from_latest(self) -> None:
        """A resumed run trains on from its newest version, not from the base again. The sampler gets it back from
        `restore_latest_adapter`; the trainer's weights are its own when they are a copy (llama.cpp samples from a
        GGUF, the trainer trains a bf16 copy), and a fresh LoRA there made the next version base + one step,
        dropping every earlier update. AdamW's moments come back too (saved beside the newest adapter): with fresh
        ones a resumed run's first steps are full-size, as if it had never trained."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        saved = [v for v in self._versions() if v.adapter_path]
        latest = max(saved, key=lambda v: v.number, default=None)
        weights = None if latest is None else Path(latest.adapter_path) / "adapter_model.safetensors"
        if weights is not None and weights.is_file():
            loaded = set_peft_model_state_dict(
                self.trainer.model, load_file(str(weights), device=str(self.trainer.device))
            )
            if not getattr(loaded, "unexpected_keys", None):  # moments only for the weights they belong to
                self.trainer.resume_optimizer(weights.parent)
        for older in saved:  # moments a crash left behind the newest's
            if older is not latest:
                drop_optimizer(Path(older.adapter_path))  # type: ignore[arg-type]

    def _versions(self) -> list[PolicyVersionRecord]:
        return member_versions(self.archive, self.run_id, self.member, self.first)

    def step(self, should_stop: ShouldStop = never, pick: GroupPick | None = None) -> UpdateStats:
        """Load, update, save, publish and record one version; `should_stop` may abandon the update between two
        samples (`UpdateAbandoned`), which rolls back like any other failure; `pick` chooses the loaded groups
        it trains on."""
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        versions = recent_version_ids(self.archive, self.run_id, self.config.versions_back, self.member, self.first)
        batch = load_batch(self.archive, self.run_id, self.components, self.variants, versions, self.max_groups)
        weights = {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.trainer.model).items()}
        optimizer = copy.deepcopy(self.trainer.optimizer.state_dict())
        serving = self.policy.version
        rows = self._versions()
        current = next((v for v in reversed(rows) if v.number == serving), None)
        number = max([serving, *(v.number for v in rows)]) + 1  # never reuses a number, even one left by a crash
        directory, published = self.adapters_dir / f"v{number}", False
        try:
            groups = batch.groups if pick is None else pick(batch.groups)
            stats = self.trainer.update(groups, dict(batch.skipped), should_stop)
            if stats.samples == 0:
                return stats
            self._save_into(directory)
            self.publisher.publish(directory, number)
            published = True
            self.archive.add_policy_version(
                run_id=self.run_id,
                base_model=self.policy.name,
                adapter_path=str(directory),
                parent_id=None if current is None else current.id,
                number=number,
                train_config=self.config.as_dict(),
                stats=asdict(stats),
                member=self.member,
            )
        except BaseException:
            set_peft_model_state_dict(self.trainer.model, weights)
            self.trainer.optimizer.load_state_dict(optimizer)
            if published:
                self._serve_again(serving, None if current is None else current.adapter_path)
            shutil.rmtree(directory, ignore_errors=True)
            raise
        previous = max((v for v in rows if v.adapter_path), key=lambda v: v.number, default=None)
        if previous is not None:  # the new version's moments are the ones to resume from
            drop_optimizer(Path(previous.adapter_path))  # type: ignore[arg-type]
        return stats

    def _save_into(self, directory: Path) -> None:
        """Write under a staging name, then rename: `vN/` is either absent or a complete adapter."""
        staging = directory.with_name(directory.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        self.trainer.save(staging)
        shutil.rmtree(directory, ignore_errors=True)  # a crash's leftover: no version row refers to it
        staging.rename(directory)

    def _serve_again(self, number: int, adapter_path: str | None) -> None:
        """Undo a publish whose version could not be recorded: the version served before it, adapter or base."""
        if adapter_path:
            self.publisher.publish(adapter_path, number)
        else:
            self.publisher.serve_base(number)


def restore_latest_adapter(
    archive: Archive, run_id: int, policy: Policy, member: str | None = None, first: bool = True
) -> int | None:
    """On resume, serve the member's newest trained version again; returns its number (None when there is none)."""
    trained = [v for v in member_versions(archive, run_id, member, first) if v.adapter_path]
    if not trained or not isinstance(policy, PublishingPolicy):
        return None
    latest = max(trained, key=lambda v: v.number)
    if Path(latest.adapter_path).is_dir():
        policy.publish(latest.adapter_path, latest.number)
        return latest.number
    return None
