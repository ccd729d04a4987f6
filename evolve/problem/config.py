"""The schema of `problem.toml`. Unknown keys are errors so that typos never pass silently."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProgramSection(_Strict):
    file: str = "seed.py"
    language: Literal["python"] = "python"
    entry_point: str = "solve"


class EvaluatorSection(_Strict):
    file: str = "evaluate.py"
    # "auto": split when the evaluator defines both `cases` and `score`, simple otherwise.
    form: Literal["auto", "simple", "split"] = "auto"


class ComponentSpec(_Strict):
    """One named fitness component (a test case, an instance or an objective)."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
    direction: Literal["maximize", "minimize"] = "maximize"
    weight: float = Field(default=1.0, ge=0.0)
    bounds: tuple[float, float] | None = None
    fail_value: float | None = None

    @property
    def sign(self) -> float:
        return 1.0 if self.direction == "maximize" else -1.0

    @property
    def failure(self) -> float:
        """What a failed case scores: `fail_value`, else the worst bound, else 0."""
        if self.fail_value is not None:
            return self.fail_value
        if self.bounds is not None:
            return self.bounds[0] if self.direction == "maximize" else self.bounds[1]
        return 0.0


class FitnessSection(_Strict):
    """Either an explicit component list, or `cases = N` whose names are `{prefix}_{i:03d}`."""

    components: list[ComponentSpec] = Field(default_factory=list)
    cases: int | None = Field(default=None, ge=1, le=100_000)
    case_prefix: str = "case"
    direction: Literal["maximize", "minimize"] = "maximize"
    bounds: tuple[float, float] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> FitnessSection:
        if bool(self.components) == (self.cases is not None):
            raise ValueError("give exactly one of [fitness].components or [fitness].cases")
        names = [c.name for c in self.components]
        if len(set(names)) != len(names):
            raise ValueError("[fitness].components has duplicate names")
        return self

    def resolved(self) -> tuple[ComponentSpec, ...]:
        if self.components:
            return tuple(self.components)
        assert self.cases is not None
        return tuple(
            ComponentSpec(name=f"{self.case_prefix}_{i:03d}", direction=self.direction, bounds=self.bounds)
            for i in range(self.cases)
        )


class LimitsSection(_Strict):
    timeout_s: float = Field(default=10.0, gt=0, le=86_400)
    memory_mb: int = Field(default=1024, ge=64)
    max_processes: int = Field(default=64, ge=1)
    max_file_mb: int = Field(default=8, ge=1)


class SearchSection(_Strict):
    islands: int = Field(default=4, ge=1)
    migration_interval: int = Field(default=40, ge=1)
    migration_size: int = Field(default=2, ge=1)
    group_size: int = Field(default=4, ge=1)
    variants: int = Field(default=3, ge=1, le=8)
    inspirations: int = Field(default=2, ge=0)
    # auto: whole rewrites of short editable code, SEARCH/REPLACE diffs of long code (evolve.prompts.builder)
    edit_format: Literal["auto", "diff", "full"] = "auto"
    selection: Literal["auto", "lexicase", "scalarization", "tournament"] = "auto"
    features: list[str] = Field(default_factory=lambda: ["code_length", "score"])
    max_evaluations: int = Field(default=200, ge=1)
    temperature: float = Field(default=0.8, gt=0)
    max_new_tokens: int = Field(default=768, ge=16)


class ProblemConfig(_Strict):
    name: str = Field(min_length=1)
    description: str = Field(min_length=1)
    program: ProgramSection = ProgramSection()
    evaluator: EvaluatorSection = EvaluatorSection()
    fitness: FitnessSection
    limits: LimitsSection = LimitsSection()
    search: SearchSection = SearchSection()
