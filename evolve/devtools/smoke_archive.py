"""A tiny untrained archive with real groups, for the tests and benchmarks of what reads groups back (the reward
replay, the offline experiment, the trainer's resume): each kind of answer the replay tells apart, in a few rows."""

from __future__ import annotations

from pathlib import Path

from evolve.archive import Archive, CompletionRecord, NewProgram
from evolve.archive.records import EvaluationRecord
from evolve.problem import load_problem


def smoke_archive(path: Path, problem_dir: Path, parents: int = 1) -> Path:
    """An untrained archive of the problem in `problem_dir`: `parents` parents and max(3, parents) groups (group g
    asks parent g mod parents) of 4 two-answer completions whose answers are a child that beats the parent, one
    that is worse, one that scores as the parent (a docstring edit), a copy and an unparseable answer."""
    names = [c.name for c in load_problem(problem_dir).components]

    def evaluation(level: float) -> EvaluationRecord:
        return EvaluationRecord({n: level + 0.01 * i for i, n in enumerate(names)}, level, None, None, 0.01, "smoke")

    path.parent.mkdir(parents=True, exist_ok=True)
    archive = Archive(path)
    try:
        options = {"variants": 2, "max_new_tokens": 24}
        run = archive.create_run(problem_dir.name, str(problem_dir.resolve()), "smoke", {"options": options}, 0)
        version = archive.add_policy_version(run_id=run.id, base_model="smoke", number=0)
        seeds = [NewProgram(f"x{i} = 0", None, 0, 0, None, evaluation(0.5)) for i in range(parents)]
        parent_ids = [pid for pid, _ in archive.add_evaluated_programs(run.id, seeds)]
        for g in range(max(3, parents)):
            parent = parent_ids[g % parents]
            answers = [("ok", 0.5 + 0.01 * (g + 1)), ("ok", 0.4), ("ok", 0.5), ("duplicate", None)]
            completions = [CompletionRecord("c", [1, 2, 3], [-0.1, -0.2, -0.3], "stop", version) for _ in answers]
            variant_ids = archive.add_group(
                run.id,
                parent_id=parent,
                inspiration_ids=[],
                island=0,
                prompt=f"prompt {g}",
                sampling={"temperature": 0.7},
                completions=completions,
                variants=[[(status, None, None), ("parse_error", "cut", None)] for status, _ in answers],
            )
            children = [
                NewProgram(f"y{g}_{i} = 1", parent, 0, 1, ids[0], evaluation(level))
                for i, ((_, level), ids) in enumerate(zip(answers, variant_ids, strict=True))
                if level is not None
            ]
            archive.add_evaluated_programs(run.id, children)
    finally:
        archive.close()
    return path
