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
    config = TrainConfig(learning_rate=learning_rate, lora_rank=4, versions_back=10**6)  # the base's groups too
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

        resumed.step()  # its policy serves the base (nothing restored it): v2's moments still give way to v3's
        assert not (tmp_path / "adapters" / "v2" / OPTIMIZER_FILE).exists()
        assert (tmp_path / "adapters" / "v3" / OPTIMIZER_FILE).is_file()
        (tmp_path / "adapters" / "v1" / OPTIMIZER_FILE).write_bytes(b"left by a crash")
        _trainer(tmp_path, archive, 5e-4)
        assert not (tmp_path / "adapters" / "v1" / OPTIMIZER_FILE).exists()  # cleared when training starts
    finally:
        archive.close()


def test_a_version_stays_whole_when_the_older_moments_cannot_be_removed(tmp_path: Path, monkeypatch) -> None:
    """Removing the previous version's moments comes after the new version is recorded, and its failure (a
    read-only file, say) costs a stale file, never the recorded version's adapter."""
    import pathlib

    from policies.tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    tiny_model(tok, seed=0).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    archive = Archive(smoke_archive(tmp_path / "a.db", MINIMIZER, parents=3))
    real_unlink = pathlib.Path.unlink

    def refuse(self: pathlib.Path, missing_ok: bool = False) -> None:
        if self.name == OPTIMIZER_FILE:
            raise PermissionError(f"{self}: read-only")
        real_unlink(self, missing_ok=missing_ok)

    try:
        trainer = _trainer(tmp_path, archive, 1e-3)
        trainer.step()
        monkeypatch.setattr(pathlib.Path, "unlink", refuse)
        trainer.step()
        rows = archive.policy_versions(archive.find_run(None).id)
        versions = [(v.number, Path(v.adapter_path).is_dir()) for v in rows if v.adapter_path]
    finally:
        archive.close()
    assert (1, True) in versions and (2, True) in versions, versions


def _fake_step(trainer: object) -> None:
    """One AdamW step with random gradients: moments without a forward pass."""
    for p in trainer.model.parameters():  # type: ignore[attr-defined]
        if p.requires_grad:
            p.grad = torch.randn_like(p)
    trainer.optimizer.step()  # type: ignore[attr-defined]
    trainer.optimizer.zero_grad()  # type: ignore[attr-defined]


def test_moments_that_do_not_fit_or_cannot_be_read_leave_a_fresh_optimizer_that_steps(tmp_path: Path) -> None:
    """Another adapter's moments (same count of parameters, other shapes: load_state_dict alone accepts them and
    every later step fails) and a file a crash left empty or garbled are refused, and the trainer steps."""
    from policies.tiny import tiny_model, tiny_tokenizer
    from policies.trainer import PolicyTrainer

    tok = tiny_tokenizer()

    def trainer(modules: tuple[str, ...]) -> PolicyTrainer:
        return PolicyTrainer(tiny_model(tok, seed=0), tok, str, TrainConfig(lora_rank=4, target_modules=modules))

    saved = trainer(("q_proj", "v_proj"))
    _fake_step(saved)
    saved.save(tmp_path / "v1")
    other = trainer(("k_proj", "o_proj"))
    assert not other.resume_optimizer(tmp_path / "v1")
    _fake_step(other)  # fresh moments of its own shapes
    for content in (b"", b"not a torch file"):
        (tmp_path / "v1" / OPTIMIZER_FILE).write_bytes(content)
        fresh = trainer(("q_proj", "v_proj"))
        assert not fresh.resume_optimizer(tmp_path / "v1")
        assert not fresh.optimizer.state
        _fake_step(fresh)
