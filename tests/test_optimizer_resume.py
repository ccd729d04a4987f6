"""A run cut off between updates resumes its training with the optimizer's moments, not fresh ones (issue 61:
"where an arm is cut off, it resumes with its optimiser state"), and only the newest version keeps them on disk."""

from __future__ import annotations

from pathlib import Path

import torch

from evolve.archive import Archive
from evolve.devtools.smoke_archive import smoke_archive
from evolve.problem import load_problem
from evolve.training import ArchiveTrainer
from policies.optimizer_state import OPTIMIZER_FILE
from policies.trainer import TrainConfig

MINIMIZER = Path(__file__).resolve().parent.parent / "benchmarks" / "problems" / "minimizer"


def _trainer(tmp_path: Path, archive: Archive, learning_rate: float) -> ArchiveTrainer:
    from policies.transformers_policy import TransformersPolicy

    run = archive.find_run(None)
    components = list(load_problem(Path(run.problem_dir)).components)
    policy = TransformersPolicy.load(str(tmp_path / "tiny"))
    config = TrainConfig(learning_rate=learning_rate, lora_rank=4)
    return ArchiveTrainer(archive, run.id, components, 2, policy, config, tmp_path / "adapters")


def _moments(trainer: ArchiveTrainer) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    state = trainer.trainer.optimizer.state_dict()["state"]
    return [(int(s["step"]), s["exp_avg"].clone(), s["exp_avg_sq"].clone()) for _, s in sorted(state.items())]


def test_a_resumed_trainer_takes_the_moments_of_the_newest_version(tmp_path: Path) -> None:
    from policies.tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    tiny_model(tok, seed=0).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    archive = Archive(smoke_archive(tmp_path / "a.db", MINIMIZER, parents=3))
    try:
        first = _trainer(tmp_path, archive, 1e-3)
        first.step()
        first.step()
        before = _moments(first)
        assert before and {step for step, _, _ in before} == {before[0][0]} and before[0][0] >= 2  # two updates
        assert not (tmp_path / "adapters" / "v1" / OPTIMIZER_FILE).exists()  # only the newest keeps its moments
        assert (tmp_path / "adapters" / "v2" / OPTIMIZER_FILE).is_file()

        resumed = _trainer(tmp_path, archive, 5e-4)  # a restart, with another learning rate asked for
        after = _moments(resumed)
        assert [s for s, _, _ in after] == [s for s, _, _ in before]
        for (_, avg_a, sq_a), (_, avg_b, sq_b) in zip(before, after, strict=True):
            assert torch.equal(avg_a, avg_b) and torch.equal(sq_a, sq_b)
        assert {g["lr"] for g in resumed.trainer.optimizer.param_groups} == {5e-4}
    finally:
        archive.close()
