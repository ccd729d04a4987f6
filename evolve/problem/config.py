"""The schema of `problem.toml`. Unknown keys are errors so that typos never pass silently."""

from __future__ import annotations

import re
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from evolve.problem.seed_files import folder_path

# A problem's name names its files: the default archive `runs/NAME.db`, `runs/NAME.adapters/`. So it is a plain
# file name, never a path (`/some/dir/app` put the archive there, `../x` beside the runs folder) nor a hidden file.
NAME_PATTERN = r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}"


def plain_name(text: str, default: str = "problem") -> str:
    """`text` (a folder's name, say) made a problem name NAME_PATTERN takes: every run of other characters one
    `-`, no leading or trailing `-` or `.`, at most 100 characters; `default` when nothing is left."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")[:100].rstrip("-.") or default


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _inside_folder(path: str) -> str:
    """A file the problem names is read from its folder and may reach a prompt: relative, plain, inside it (the
    one rule, evolve.problem.seed_files; symlinks are checked where the folder is known, in the loader)."""
    try:
        return folder_path(path)
    except ValueError as exc:
        raise PydanticCustomError("folder_path", str(exc)) from None


class ProgramSection(_Strict):
    file: str = "seed.py"  # the seed program, relative to the problem folder; with `files`: the entry file
    # A program of several files: its files and folders ("lib/" takes every file under lib), relative to the
    # problem folder. None: the program is `file` alone, one text as it always was.
    files: list[str] | None = Field(default=None, min_length=1)
    # Any language: "python" is imported by the harness; any other needs [run] (and usually [build]).
    language: str = Field(default="python", pattern=r"^[a-z][a-z0-9+#_-]{0,19}$")
    entry_point: str = "solve"  # split form (Python): the function each case's input is passed to
    # How a prompt shows a program of several files: "files" shows the files with blocks whole and the fixed files
    # as context; "blocks" only the EVOLVE blocks under their files' headers (the fixed files named), as a one-file
    # program is shown: a small model given a fixed file rewrites it instead of the blocks.
    prompt_view: Literal["files", "blocks"] = "files"

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, files: list[str] | None) -> list[str] | None:
        for entry in files or ():
            _inside_folder(entry.removesuffix("/"))
        return files

    @field_validator("file")
    @classmethod
    def _relative_file(cls, file: str) -> str:
        return _inside_folder(file)

    @model_validator(mode="before")
    @classmethod
    def _entry_defaults_to_first_file(cls, data: Any) -> Any:
        """With `files` and no `file`, the entry is the first of `files` (set here, so a stored config that is
        read back names the same entry)."""
        if isinstance(data, dict) and data.get("files") and "file" not in data and isinstance(data["files"][0], str):
            return {**data, "file": data["files"][0].removesuffix("/")}
        return data

    @property
    def entry(self) -> str:
        """The file the harness imports (or the simple form's evaluator is given)."""
        return self.file


class BuildSection(_Strict):
    """`[build]`: the command that turns the program into something `[run]` can start, run in the sandbox's
    work folder beside the program, under its own limits (a compiler may need more than the program)."""

    command: list[str] = Field(min_length=1)  # argv, no shell: ["gcc", "-O2", "-o", "prog", "prog.c"]
    timeout_s: float = Field(default=30.0, gt=0, le=3600)  # wall time of the build; past it: kind `build`
    memory_mb: int = Field(default=1024, ge=64)  # address space of each build process
    max_file_mb: int = Field(default=64, ge=1)  # largest file the build may write (objects, the binary)


class RunSection(_Strict):
    """`[run]`: how the built program starts. Split form: once per case, the case's input as one JSON line on
    stdin, its output one JSON value on stdout. Simple form: the evaluator starts it (EVOLVE_RUN_COMMAND)."""

    command: list[str] = Field(min_length=1)  # argv, run in the work folder: ["./prog"]


class EvaluatorSection(_Strict):
    file: str = "evaluate.py"  # trusted: `evaluate(program_path)`, or `cases()` + `score(case, output)`

    @field_validator("file")
    @classmethod
    def _relative_file(cls, file: str) -> str:
        return _inside_folder(file)

    # "auto": split when the evaluator defines both `cases` and `score`, simple otherwise.
    form: Literal["auto", "simple", "split"] = "auto"
    # Simple form: "strict" wants exactly the components back (unless the evaluator reports an error);
    # "lenient" (OpenEvolve folders) gives a missing component its fail value and makes extra numbers feedback.
    names: Literal["strict", "lenient"] = "strict"
    # OpenEvolve's cascade: with evaluate_stage1/2/3 defined, stage k+1 runs only while the merged metrics
    # (combined_score, else their mean) reach thresholds[k]; a stage without a threshold never runs.
    cascade: bool = True
    cascade_thresholds: list[float] = Field(default_factory=lambda: [0.5, 0.75, 0.9])


class ComponentSpec(_Strict):
    """One named fitness component (a test case, an instance or an objective)."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
    direction: Literal["maximize", "minimize"] = "maximize"
    weight: float = Field(default=1.0, ge=0.0)  # its share of the scalar view
    bounds: tuple[float, float] | None = None  # (low, high) as reported; normalises selection and rewards
    fail_value: float | None = None  # what a failure scores; default in `failure`

    @property
    def sign(self) -> float:
        return 1.0 if self.direction == "maximize" else -1.0

    @property
    def failure(self) -> float:
        """What a failed case scores: `fail_value`, else the worst bound.

        A problem must give one of them (`ProblemConfig` refuses it otherwise); the 0 left below only serves the
        stored configs of runs made before that rule, so their archives still read back.
        """
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
    fail_value: float | None = None  # what a failed case scores (`cases` form); default: the worst bound

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
            ComponentSpec(
                name=f"{self.case_prefix}_{i:03d}",
                direction=self.direction,
                bounds=self.bounds,
                fail_value=self.fail_value,
            )
            for i in range(self.cases)
        )


class LimitsSection(_Strict):
    """What one evaluation may use inside the sandbox; past a limit it fails with that error kind."""

    timeout_s: float = Field(default=10.0, gt=0, le=86_400)  # wall time of one whole evaluation (all cases)
    # split form: wall time of one case; a slow case fails alone (kind timeout) and the others still score
    case_timeout_s: float | None = Field(default=None, gt=0, le=86_400)
    memory_mb: int = Field(default=1024, ge=64)  # memory of the candidate
    max_processes: int = Field(default=64, ge=1)  # processes and threads of the candidate
    max_file_mb: int = Field(default=8, ge=1)  # largest file it may write


EditFormat = Literal["auto", "diff", "full"]
EDIT_FORMATS: tuple[str, ...] = get_args(EditFormat)


class PolicyMemberSection(_Strict):
    """`[[search.policies]]`: one member of the run's ensemble (see evolve.members); unset settings come from
    `[search]` and the run's options. The one declaration of a member's keys, bounds and choices: a
    `MemberSpec` (`--policy SPEC[key=value,...]`, a stored run's member) is checked by `member_setting_error`, and
    takes its sampling keys from here."""

    spec: str = Field(min_length=1, description="a policy spec, as --policy takes it")
    name: str | None = Field(default=None, min_length=1, description="unique in the run; default: spec+settings")
    weight: float = Field(default=1.0, gt=0, description="prior value per cost (bandit), or share (weights)")
    temperature: float | None = Field(default=None, gt=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    template: Literal["standard", "directed"] | None = None
    edit_format: EditFormat | None = None


MEMBER_IDENTITY = ("spec", "name", "weight")  # the rest of a member's keys say how it samples


def member_setting_error(key: str, value: Any) -> str | None:
    """Why `value` cannot be a member's `key` by `PolicyMemberSection`'s bounds and choices (`weight 0 must be >
    0`, `template 'x'; use one of standard, directed`), or None: one line, whichever way the member was given."""
    if value is None:
        return None
    info = PolicyMemberSection.model_fields[key]
    choices = next((get_args(t) for t in get_args(info.annotation) if get_origin(t) is Literal), ())
    if choices and value not in choices:
        return f"{key} {value!r}; use one of {', '.join(choices)}"
    gt = next((m.gt for m in info.metadata if getattr(m, "gt", None) is not None), None)
    le = next((m.le for m in info.metadata if getattr(m, "le", None) is not None), None)
    if gt is not None and le is not None and not gt < value <= le:
        return f"{key} {value} must be in ({gt}, {le}]"
    if gt is not None and not value > gt:
        return f"{key} {value} must be > {gt}"
    return None


class SearchSection(_Strict):
    """`[search]`: the one home of the search defaults; `RunOptions` and the CLI flags fall back to these."""

    islands: int = Field(default=4, ge=1, description="independent sub-populations, each its own MAP-Elites grid")
    migration_interval: int = Field(default=40, ge=1, description="evaluations between ring migrations")
    migration_size: int = Field(default=2, ge=1, description="best programs each island sends to the next")
    group_size: int = Field(default=4, ge=1, le=1024, description="completions sampled per prompt (G)")
    variants: int = Field(default=3, ge=1, le=8, description="variants written per completion (m)")
    inspirations: int = Field(default=2, ge=0, description="other programs shown in the prompt beside the parent")
    edit_format: Literal["auto", "diff", "full"] = Field(
        default="auto",
        description="variants as SEARCH/REPLACE (diff) or whole code (full); auto: full for editable code of at "
        "most 40 lines, else diff",
    )
    selection: Literal["auto", "lexicase", "scalarization", "tournament"] = Field(
        default="auto", description="how a parent is picked from an island's elites"
    )
    features: list[str] = Field(
        default_factory=lambda: ["code_length", "score"],
        description="MAP-Elites axes: code_length, score (the scalar view) or a component name",
    )
    max_evaluations: int = Field(default=200, ge=1, description="evaluation budget, summed over resumes")
    temperature: float = Field(default=0.8, gt=0, description="sampling temperature of the policy")
    top_p: float = Field(default=0.95, gt=0, le=1, description="nucleus sampling mass")
    max_new_tokens: int = Field(default=768, ge=16, le=131072, description="longest completion sampled")
    fit_tokens_to_code: bool = Field(
        default=True,
        description="cap each group's max_new_tokens at what m answers for its parent's editable code need "
        "(evolve.prompts.completion_budget); false for a model that reasons at length before it answers",
    )
    policies: list[PolicyMemberSection] = Field(
        default_factory=list, description="the run's ensemble members; empty: the one --policy"
    )


class TrainingSection(_Strict):
    """`[training]`: how updates shape a group's rewards (policies/shaping.py); the CLI flags override these."""

    skip_zero_advantage: bool = Field(
        default=True, description="leave groups and completions whose advantage is zero out of the batch"
    )
    lazy_penalty: float = Field(
        default=0.0,
        le=0.0,
        description="reward of an answer that gave no new valid program (an echo of its parent, a known program "
        "repeated, unparseable or missing, failed), on every component (rewards are in [0, 1]; below 0 each ranks "
        "under every valid answer); 0: off, a zero row",
    )
    reward_normalisation: Literal["bounds", "group", "improvement"] = Field(
        default="improvement",
        description="bounds: rewards in [0, 1] by the declared bounds; group: then each component stretched to "
        "[0, 1] over its group's answers before the scalarisation; improvement: each answer's gain over its "
        "parent in units of the declared range, a small penalty for an answer that changed no score",
    )


class ProblemConfig(_Strict):
    name: str
    description: str = Field(min_length=1)
    program: ProgramSection = ProgramSection()
    evaluator: EvaluatorSection = EvaluatorSection()
    fitness: FitnessSection
    limits: LimitsSection = LimitsSection()
    search: SearchSection = SearchSection()
    training: TrainingSection = TrainingSection()
    build: BuildSection | None = None
    run: RunSection | None = None

    @property
    def native(self) -> bool:
        """True when the program runs as its own process ([run]) rather than imported by the Python harness."""
        return self.run is not None

    @property
    def sandbox_limits(self) -> LimitsSection:
        """What the sandbox allows the whole job: the build and the evaluation one after the other, so their
        times add up and the larger memory and file limits hold (the harness lowers them for each part)."""
        if self.build is None:
            return self.limits
        return self.limits.model_copy(
            update={
                "timeout_s": self.limits.timeout_s + self.build.timeout_s,
                "memory_mb": max(self.limits.memory_mb, self.build.memory_mb),
                "max_file_mb": max(self.limits.max_file_mb, self.build.max_file_mb),
            }
        )

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if not re.fullmatch(NAME_PATTERN, name):
            raise PydanticCustomError(
                "problem_name",
                "{name} is not a plain name (it names the archive, runs/NAME.db): use letters, digits and _ . - only, "
                'at most 100, no slash and no leading dot, e.g. name = "my_problem"',
                {"name": repr(name[:60])},
            )
        return name

    @model_validator(mode="after")
    def _runnable(self) -> ProblemConfig:
        if self.program.language != "python" and self.run is None:
            raise ValueError(
                f"[program] language = {self.program.language!r} needs [run] command = [...] (and usually "
                "[build] command = [...]) saying how to start the program"
            )
        if self.build is not None and self.run is None:
            raise ValueError("[build] needs [run] command = [...] saying how to start what it built")
        return self

    @model_validator(mode="after")
    def _failure_is_worst(self) -> ProblemConfig:
        # Without bounds no default fail value is safely the worst (0 beats every honest `minimize` score or
        # negative `maximize` one), so a failing program could outrank honest ones: the user must say.
        if self.fitness.cases is not None and self.fitness.bounds is None and self.fitness.fail_value is None:
            raise ValueError(
                "[fitness].cases needs bounds = [low, high] or fail_value = <worse than any honest score> "
                "so a failing program never scores best"
            )
        for c in self.fitness.components:
            if c.bounds is None and c.fail_value is None:
                raise ValueError(
                    f"component {c.name!r} has neither bounds nor fail_value; add bounds = [low, high] or "
                    "fail_value = <a value worse than any honest score> so a failing program never scores best"
                )
        return self
