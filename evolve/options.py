"""The run's options, declared once.

`RunOptions` is the one declaration: each field carries its default, its help text, its flag and its bounds
(`OptionMeta`). An option whose default comes from the problem's `[search]` or `[training]` table takes its
default, help and bounds from that table's field (`evolve.problem.config`), so a bound or a description is written
in one place. Everything else is derived from it: `RunOverrides` (the same fields, each None when not given:
what one command or library call gives), `RunOptions.for_problem` (the problem's tables under what was given), the
flags of `evolve run` and `evolve resume` (`flag_parameters`, evolve/cli/run_cmd.py), the stored run options
(`asdict`), and the one-line checks of a given value's choices and bounds (`invalid_value`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from evolve.ask_arms import ASK_ARMS
from evolve.bandit import ALLOCATIONS, COST_UNIT
from evolve.members import MemberError, MemberSpec, members_from
from evolve.problem.config import EDIT_FORMATS, SearchSection, TrainingSection
from evolve.problem.errors import ProblemError
from evolve.problem.seed_files import folder_file
from evolve.prompts.builder import OTHERS_VIEWS
from policies.advantages import METHODS as TRAIN_METHODS
from policies.policy import PolicyError
from policies.shaping import NORMALISATIONS
from policies.spec import PolicySpec
from policies.trainer import TrainConfig
from sandboxes.process_slots import UID_RANGE

_SEARCH, _TRAINING = SearchSection(), TrainingSection()
SQL_INT_MAX = 2**63 - 1  # the largest integer an archive's column holds
DEFAULT_POLICY = "embedded"  # the embedded model on llama.cpp where it is installed, else transformers


@dataclass(frozen=True)
class OptionMeta:
    """How one option shows outside the dataclass."""

    help: str
    flag: str | None = ""  # the command-line flag ("": the field's name with dashes; None: no flag)
    section: str | None = None  # "search" | "training": the problem table its default comes from
    low: float | None = None  # bounds of a number, for the flag
    high: float | None = None
    choices: tuple[str, ...] = ()  # the values it may take
    negative: str | None = None  # a switch's off flag, e.g. "keep-zero-advantage" (default: no-FLAG)
    on_resume: bool = False  # also a flag of `evolve resume`
    resume_help: str | None = None


def _from_table(name: str, section: str) -> Any:
    """An option whose default, help and bounds are those of the `[search]` / `[training]` field of that name."""
    table = SearchSection if section == "search" else TrainingSection
    info = table.model_fields[name]
    low = next((getattr(m, "ge", None) for m in info.metadata if getattr(m, "ge", None) is not None), None)
    high = next((getattr(m, "le", None) for m in info.metadata if getattr(m, "le", None) is not None), None)
    default = getattr(_SEARCH if section == "search" else _TRAINING, name)
    return default, OptionMeta(info.description or name, section=section, low=low, high=high)


def option(default: Any, help: str, **meta: Any) -> Any:
    return field(default=default, metadata={"option": OptionMeta(help, **meta)})


def table_option(name: str, section: str = "search", **meta: Any) -> Any:
    default, info = _from_table(name, section)
    info = OptionMeta(**{**asdict(info), **meta})
    return field(default=default, metadata={"option": info})


@dataclass(frozen=True)
class RunOptions:
    """What one `evolve run` was asked for; stored with the run."""

    # at most the process sandbox's uid slots (sandboxes/process_slots.py), and a thread each
    workers: int = option(2, "evaluations in flight at once", low=1, high=UID_RANGE, on_resume=True)
    group_size: int = table_option("group_size")
    variants: int = table_option("variants")
    max_evaluations: int = table_option("max_evaluations", on_resume=True, resume_help="extend the evaluation budget")
    max_time_s: float | None = option(
        None, "wall-clock budget in seconds, summed over resumes", flag="max-time", on_resume=True
    )
    timeout_s: float | None = option(
        None,
        "seconds one evaluation may take, over the problem's [limits] timeout_s (default: the problem's, else 10 x "
        "the seed's time, 10 to 300 s: evolve/problem/timeout_rule.py)",
        flag="timeout",
        low=0.1,
        high=86_400,
        on_resume=True,
    )
    target: float | None = option(None, "stop once the best scalar view reaches this", on_resume=True)
    seed: int = option(0, "seeds selection and sampling, group by group", low=0, high=SQL_INT_MAX)  # runs.seed
    edit_format: str = table_option("edit_format", choices=EDIT_FORMATS)
    temperature: float = table_option("temperature", low=0.0)
    max_new_tokens: int = table_option("max_new_tokens")
    fit_tokens_to_code: bool = table_option("fit_tokens_to_code")
    structured: str = option(
        "auto",
        "hold each answer to the shape the prompt asks for while it is sampled (tags, fences or edits), where the "
        "policy can (llama.cpp's grammars); auto and on: there, off: free text",
        choices=("auto", "on", "off"),
    )
    lead_comment: bool = option(
        False,
        "where an answer is held to its shape in the full format, open each fenced block with a comment line "
        "`# Change: ...` (in the language's line comment) that says what the variant changes (off until measured: "
        "docs/answer-shape.md)",
    )
    copy_guard: bool = option(
        True,
        "where an answer is held to its shape in the full format, turn a block that is copying a known code (the "
        "parent, the programs shown, the parent's newest children, the group's finished blocks) off the copy at "
        "the first point of code where the model doubts it (policies/copy_guard.py; llama.cpp and transformers "
        "policies; docs/yield.md)",
    )
    fixed_code: bool = option(
        True,
        "show a one-file program's code around its EVOLVE blocks once in each prompt, read-only, so the model sees "
        "how its editable code is called (evolve/problem/fixed_code.py; docs/yield.md)",
    )
    interface_reminder: bool = option(
        False,
        "name in each prompt the editable code's functions that the fixed code calls (`priority(job)`), say "
        "that every variant must define them, and show the first call the seed's evaluation made of each "
        "(off: its A/B without the call showed no gain, docs/yield.md)",
    )
    others_view: str = option(
        "code",
        "how a prompt shows the other programs and the parent's recent children: code (whole) or diff (only their "
        "changes from the parent, which a small model cannot paste back as a copy)",
        choices=OTHERS_VIEWS,
    )
    recent_children: int = option(
        2,
        "how many of the parent's newest children its prompt shows as already tried (a small model asked again "
        "from one parent mostly rewrites a child it wrote before: docs/yield.md)",
        low=0,
        high=64,
    )
    zero_child_feedback: bool = option(
        False,
        "list the parent's newest children that scored the worst value on every component among its prompt's failed "
        "attempts, with the evaluator's feedback and the errors their code raised into it (off: its A/B showed "
        "no gain, docs/yield.md)",
    )
    spent_parent_weight: float = option(
        1.0,
        "a parent's chance to take part in a pick is multiplied by this for each group in a row from it that made "
        "fewer new programs than it had completions (1: off, the default until an A/B shows it helps: "
        "docs/yield.md)",
        low=0.0,
        high=1.0,
    )
    policy: str = option(DEFAULT_POLICY, "the policy spec", flag=None)  # `--policy` makes members (run_cmd)
    train_every: int = option(0, "update the policy every N groups (0: never)", low=0)
    train_method: str = option(TRAIN_METHODS[0], "the advantage estimator of an update", choices=TRAIN_METHODS)
    top_p: float = table_option("top_p", flag=None)
    sandbox: str = option("auto", "auto | docker | process | ray[:ADDRESS]")
    allow_weak_sandbox: bool = option(
        False, "run a split-form problem although candidates could read its expected answers"
    )
    learning_rate: float = option(TrainConfig.learning_rate, "LoRA learning rate")
    train_epochs: int = option(
        TrainConfig.epochs, "PPO epochs over each update's batch (the clip acts from the second)", low=1, high=64
    )
    kl_coef: float = option(
        TrainConfig.kl_coef, "weight of a KL term to the base model in each update (0: none)", low=0.0
    )
    adapters_dir: str | None = option(None, "where adapters go (default: next to the archive)")
    trainer_model: str | None = option(None, "local dir or hub id of the served base model (vllm:/openai: policies)")
    patience: int | None = option(
        None, "stop after N evaluations without a new best scalar", low=1, high=SQL_INT_MAX, on_resume=True
    )
    stop_when_solved: bool = option(True, "stop once one program scores every component at its best declared bound")
    max_failures: int = option(5, "stop when the same unexpected failure repeats N times in a row", low=1)
    stall_groups: int = option(6, "stop after N groups in a row without a new child (0: never)", low=0, on_resume=True)
    template: str = option("directed", "the prompt template a member asks with unless it sets its own", flag=None)
    max_groups: int | None = option(
        None, "stop generating after this many groups, summed over resumes", flag="max-groups", low=1, on_resume=True
    )
    # The ensemble (evolve.members, evolve.ensemble): members as stored tables; empty = the one `policy`.
    policies: list[dict[str, Any]] = field(
        default_factory=list, metadata={"option": OptionMeta("the ensemble's members", flag=None)}
    )
    trust_problem_urls: bool = option(
        False,
        "send the API key (EVOLVE_API_KEY or OPENAI_API_KEY) also to the policy servers that the problem folder names "
        r"in \[\[search.policies]]; without it they are sent none (a --policy given here always gets it)",
        on_resume=True,
    )
    allocation: str = option("bandit", "how members share groups", choices=ALLOCATIONS)
    asks: str = option(
        "base,hotter,template,full", f"ask arms the bandit tries, of {','.join(ASK_ARMS)} (base alone: fixed)"
    )
    bandit_cost: str = option("tokens", "what a group costs its member and ask", choices=tuple(COST_UNIT))
    # How an update shapes rewards (policies/shaping.py); defaults from the problem's `[training]`.
    skip_zero_advantage: bool = table_option("skip_zero_advantage", "training", negative="keep-zero-advantage")
    lazy_penalty: float = table_option("lazy_penalty", "training")
    reward_normalisation: str = table_option("reward_normalisation", "training", choices=NORMALISATIONS)

    def members(self) -> list[MemberSpec]:
        """The members sampling this run's groups (one, `policy`, unless `policies` lists several), each with
        whether its server may be sent the API key (`env_key`: not a problem folder's, unless trusted)."""
        trusted = self.trust_problem_urls
        return [replace(m, env_key=trusted or not m.from_problem) for m in members_from(self.policy, self.policies)]

    @classmethod
    def for_problem(
        cls, search: SearchSection, training: TrainingSection | None = None, *, root: Path | None = None, **given: Any
    ) -> RunOptions:
        """Options for a problem: what was given (None = not given), else the problem's `[search]` and
        `[training]` values. A relative file in a `[[search.policies]]` spec is the problem folder's (`root`),
        like its seed, and is stored absolute: read from the working directory, it named another file, or none. Its
        members are marked `from_problem` (no API key unless trusted); a file of theirs outside the folder is a
        `MemberError`."""
        tables = {"search": search, "training": training or _TRAINING}
        from_tables = {f.name: getattr(tables[meta(f).section], f.name) for f in fields(cls) if meta(f).section}
        listed = [{**m.model_dump(exclude_none=True), "from_problem": True} for m in search.policies]
        for member in listed if root is not None else ():
            member["spec"] = _folder_spec(member["spec"], root)
        if listed:
            from_tables["policies"] = listed
            from_tables["policy"] = listed[0]["spec"]
        chosen = {k: v for k, v in given.items() if v is not None}
        return cls(**{**from_tables, **chosen})


def _folder_spec(spec: str, root: Path) -> str:
    """A `[[search.policies]]` spec with its file made absolute inside the problem folder `root`: a file it names
    must be there, as the seed must (evolve.problem.seed_files); a spec that does not parse is left for
    `make_policy` to refuse in one line."""
    try:
        parsed = PolicySpec.parse(spec)
    except PolicyError:
        return spec
    if parsed.local_path is not None:
        try:
            folder_file(root, parsed.local_path, f"[[search.policies]] spec {spec!r}")
        except ProblemError as exc:
            raise MemberError(str(exc)) from None
    return str(parsed.anchored(root))


def meta(f: Field[Any]) -> OptionMeta:
    return f.metadata["option"]


def option_default(name: str) -> Any:
    """A `RunOptions` field's default, for help texts (so that they never repeat it)."""
    f = next(f for f in fields(RunOptions) if f.name == name)
    return f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]


@dataclass(frozen=True)
class RunOverrides:
    """What one `evolve run`/`resume` (or a library call) gives, each `RunOptions` field as `TYPE | None`, None being
    "not given". A new run takes it over the problem's `[search]` and the defaults; a resume takes the stored options
    and records each given value that differs as an override. Written out so that a type checker sees its fields;
    tests/test_options_once.py fails when it and `RunOptions` differ by a field, its place or its type."""

    workers: int | None = None
    group_size: int | None = None
    variants: int | None = None
    max_evaluations: int | None = None
    max_time_s: float | None = None
    timeout_s: float | None = None
    target: float | None = None
    seed: int | None = None
    edit_format: str | None = None
    temperature: float | None = None
    max_new_tokens: int | None = None
    fit_tokens_to_code: bool | None = None
    structured: str | None = None
    lead_comment: bool | None = None
    copy_guard: bool | None = None
    fixed_code: bool | None = None
    interface_reminder: bool | None = None
    others_view: str | None = None
    recent_children: int | None = None
    zero_child_feedback: bool | None = None
    spent_parent_weight: float | None = None
    policy: str | None = None
    train_every: int | None = None
    train_method: str | None = None
    top_p: float | None = None
    sandbox: str | None = None
    allow_weak_sandbox: bool | None = None
    learning_rate: float | None = None
    train_epochs: int | None = None
    kl_coef: float | None = None
    adapters_dir: str | None = None
    trainer_model: str | None = None
    patience: int | None = None
    stop_when_solved: bool | None = None
    max_failures: int | None = None
    stall_groups: int | None = None
    template: str | None = None
    max_groups: int | None = None
    policies: list[dict[str, Any]] | None = None
    trust_problem_urls: bool | None = None
    allocation: str | None = None
    asks: str | None = None
    bandit_cost: str | None = None
    skip_zero_advantage: bool | None = None
    lazy_penalty: float | None = None
    reward_normalisation: str | None = None

    def given(self) -> dict[str, Any]:
        """The options given, by name. `policy` and `policies` are two views of the members: either given alone sets
        the other (one policy is a one-member list; a list's first member is `policy`)."""
        chosen = {k: v for k, v in asdict(self).items() if v is not None}
        if "policies" in chosen and chosen["policies"] and "policy" not in chosen:
            chosen["policy"] = chosen["policies"][0]["spec"]
        if "policy" in chosen and "policies" not in chosen:
            chosen["policies"] = []
        return chosen

    @classmethod
    def of(cls, options: RunOptions) -> RunOverrides:
        """Every option given: a `RunOptions` taken whole (on resume, each field that differs is an override)."""
        return cls(**asdict(options))


def _one_of(choices: tuple[str, ...]) -> str:
    return f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1 else "".join(choices)


def bound_text(value: float) -> str:
    """A bound as a flag's help and error show it: an integer whole (2**63 - 1 is not 9.22337e+18)."""
    return str(value) if isinstance(value, int) else f"{value:g}"


def _bounds(info: OptionMeta) -> str:
    low, high = (None if v is None else bound_text(v) for v in (info.low, info.high))
    if low is not None and high is not None:
        return f"give a value from {low} to {high}"
    return f"give a value >= {low}" if low is not None else f"give a value <= {high}"


def invalid_value(values: Mapping[str, Any], spelled: Mapping[str, str] | None = None) -> str | None:
    """The first given value outside its option's choices or bounds, as the one line a command fails with (naming
    the flag as the command spells it: `spelled`, by field name, where that is not `evolve run`'s flag)."""
    for f in fields(RunOptions):
        info, value = meta(f), values.get(f.name)
        if value is None or isinstance(value, bool):
            continue
        flag = f"--{(spelled or {}).get(f.name) or info.flag or f.name.replace('_', '-')}"
        if info.choices and value not in info.choices:
            return f"{flag} {value}: use {_one_of(info.choices)}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"{flag} {value}: give a finite number"
        low, high = info.low, info.high
        if isinstance(value, int | float) and (
            (low is not None and value < low) or (high is not None and value > high)
        ):
            return f"{flag} {bound_text(value)}: {_bounds(info)}"
    return None
