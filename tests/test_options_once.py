"""The run's options are declared once (evolve/options.py): the flags of `evolve run`, `evolve resume` and
`evolve train`, their help, defaults and bounds, `RunOverrides` and the problem's `[search]` defaults all come from
`RunOptions`, so none of them can drift from it."""

from __future__ import annotations

import ast
import inspect
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
import typer
from typer.testing import CliRunner

from evolve.ask_arms import Ask
from evolve.cli import app
from evolve.members import SAMPLING_KEYS, MemberError, MemberSpec
from evolve.options import RunOptions, RunOverrides, bound_text, meta, option_default
from evolve.problem.config import PolicyMemberSection, SearchSection, TrainingSection
from evolve.prompts import TEMPLATES
from policies.shaping import LAZY_PENALTY, NORMALISATION, NORMALISATIONS, SKIP_ZERO_ADVANTAGE
from policies.trainer import TrainConfig


def flags(name: str) -> dict[str, Any]:
    """A command's options as Typer builds them (name, flags, help, bounds)."""
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params if p.opts and p.opts[0].startswith("--")}


def test_every_option_with_a_flag_is_a_flag_of_run_with_its_declared_help_and_bounds():
    shown = flags("run")
    for f in fields(RunOptions):
        info = meta(f)
        if info.flag is None:  # `--policy` is the command's own: repeated, it makes the ensemble's members
            assert f.name not in shown or f.name == "policy", f.name
            continue
        option = shown[f.name]
        assert option.opts == [f"--{info.flag or f.name.replace('_', '-')}"], option.opts
        if info.section:  # help and bounds are the [search] / [training] field's own
            table = SearchSection if info.section == "search" else TrainingSection
            assert table.model_fields[f.name].description in (option.help or ""), f.name
        if info.low is not None or info.high is not None:
            low, high = ("" if v is None else bound_text(v) for v in (info.low, info.high))
            assert f"({low}..{high})" in (option.help or ""), f.name


def test_resume_and_train_take_their_flags_from_the_same_declaration():
    resumable = {f.name for f in fields(RunOptions) if meta(f).on_resume}
    assert set(flags("resume")) - {"run_id", "policy"} == resumable
    assert "(..0)" in flags("train")["lazy_penalty"].help  # [training] lazy_penalty: le=0
    assert [f.name for f in fields(RunOverrides)] == [f.name for f in fields(RunOptions)]


def test_a_bound_of_the_search_table_is_the_flag_s_bound_said_in_one_line(tmp_path):
    """`[search] variants` allows 1..8: so does `--variants`, without restating it, and says so in one line before
    anything is loaded (here there is no problem folder nor archive to load)."""
    runner = CliRunner()
    ran = runner.invoke(app, ["run", str(tmp_path), "--variants", "9"])
    assert ran.exit_code == 2 and ran.output.strip().splitlines() == ["error: --variants 9: give a value from 1 to 8"]
    resumed = runner.invoke(app, ["resume", str(tmp_path / "a.db"), "--workers", "0"])
    assert resumed.exit_code == 2 and resumed.output.strip().splitlines() == [
        "error: --workers 0: give a value from 1 to 1024"
    ]


# Each command's parameters that are its own, not options of a run (`evolve run`'s `--policy` is repeated to make
# the ensemble's members, so it is the command's own; `evolve train`'s names one spec, the option's).
OWN = {
    "run": {"problem_dir", "db", "policy"},
    "resume": {"db", "run_id", "policy"},
    "train": {"db", "steps", "run", "member"},
}


@pytest.mark.parametrize("command", sorted(OWN))
def test_no_command_declares_an_option_of_its_own(command):
    """Every flag of `evolve run`, `evolve resume` and `evolve train` that is not the command's own is a
    `RunOptions` field, shown with the field's help (a choice's values, its bounds) and no default of the flag's own:
    one declared again by hand in a command (as `evolve train` once did `--method`, `--policy`, `--adapters-dir`,
    `--trainer-model`) has a name or help of its own, and fails here."""
    options = {f.name: f for f in fields(RunOptions)}
    for name, param in flags(command).items():
        if name in OWN[command] or name == "help":
            continue
        assert name in options, f"evolve {command} --{name} is declared by the command, not in RunOptions"
        info = meta(options[name])
        help_text = param.help or ""
        assert (info.resume_help if command == "resume" and info.resume_help else info.help) in help_text, name
        if info.choices:
            assert help_text.startswith(" | ".join(info.choices)), name
        assert param.default is None, f"evolve {command} --{name}: its default is the option's, not its own"


def test_run_overrides_is_a_plain_dataclass_with_every_option_as_optional_of_its_type():
    """`RunOverrides` is written out (a type checker sees its fields, which `make_dataclass` hid) and holds each
    option of `RunOptions`, in order, as `TYPE | None`: an option added to one and not the other fails here."""
    source = inspect.getsource(RunOverrides)  # a class made at run time has no source
    assert source.startswith("@dataclass(frozen=True)\nclass RunOverrides")
    expected = [(f.name, f"{str(f.type).removesuffix(' | None')} | None") for f in fields(RunOptions)]
    assert [(f.name, str(f.type)) for f in fields(RunOverrides)] == expected
    assert all(f.default is None for f in fields(RunOverrides))


def _literal_defaults(path: str, names: set[str]) -> dict[str, object]:
    """The defaults written as literals in `path` for these names: a class field's (`name: T = 2e-5`,
    `name: T = option(2e-5, ...)`) and a function's keyword (`name: T = 0.0`)."""
    tree = ast.parse(Path(path).read_text())
    found: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in names:
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "option" and value.args:
                value = value.args[0]
            if isinstance(value, ast.Constant) and value.value is not None:  # None: "not given" (RunOverrides)
                found[node.target.id] = value.value
        if isinstance(node, ast.FunctionDef):
            args = node.args.kwonlyargs + node.args.args[len(node.args.args) - len(node.args.defaults) :]
            defaults = node.args.kw_defaults + list(node.args.defaults)
            for arg, default in zip(args, defaults, strict=False):
                if arg.arg in names and isinstance(default, ast.Constant):
                    found[f"{node.name}({arg.arg})"] = default.value
    return found


def test_each_training_default_is_written_once_and_read_where_else_it_is_needed():
    """The learning rate's default is `TrainConfig`'s; reward shaping's are policies/shaping.py's. The run's options,
    the trainer's config and the shaping functions read them rather than write them again, so that changing one
    cannot leave another behind. (`[training]` in evolve/problem/config.py is below the policies in the layers, so
    it cannot import them: its defaults are checked equal here instead.)"""
    shaping_names = {"skip_zero_advantage", "lazy_penalty", "reward_normalisation", "normalisation"}
    assert _literal_defaults("evolve/options.py", {"learning_rate", *shaping_names}) == {}
    assert _literal_defaults("policies/trainer.py", shaping_names) == {}
    assert _literal_defaults("policies/shaping.py", shaping_names) == {}
    trainer = TrainConfig()
    assert option_default("learning_rate") == trainer.learning_rate
    table = TrainingSection()
    assert (table.skip_zero_advantage, table.lazy_penalty, table.reward_normalisation) == (
        SKIP_ZERO_ADVANTAGE,
        LAZY_PENALTY,
        NORMALISATION,
    )
    assert (trainer.skip_zero_advantage, trainer.lazy_penalty, trainer.reward_normalisation) == (
        SKIP_ZERO_ADVANTAGE,
        LAZY_PENALTY,
        NORMALISATION,
    )


def test_the_training_table_offers_exactly_the_shapings_the_trainer_knows():
    """`[training] reward_normalisation` lists its choices in a Literal (evolve/problem/config.py, below the
    policies in the layers, cannot import policies/shaping.py's NORMALISATIONS): a shaping added to one side only
    would be refused by the table, or accepted by it and refused by `shape_rewards` at the run's first update."""
    annotation = TrainingSection.model_fields["reward_normalisation"].annotation
    assert get_origin(annotation) is Literal
    assert get_args(annotation) == NORMALISATIONS
    assert NORMALISATION in NORMALISATIONS


def test_a_member_s_settings_are_declared_once_by_the_problem_table():
    """`[[search.policies]]` (`PolicyMemberSection`) declares a member's keys, bounds and choices; `MemberSpec` takes
    its sampling keys and its checks from it, and `Ask` holds the same sampling keys resolved, its top_p default
    `[search]`'s. Neither module writes a key list, a bound or a choice of its own."""
    assert SAMPLING_KEYS == ("temperature", "top_p", "template", "edit_format")  # the order names a member
    identity = {"spec", "name", "weight"}
    assert [f.name for f in fields(MemberSpec) if f.name not in identity][: len(SAMPLING_KEYS)] == list(SAMPLING_KEYS)
    assert {f.name for f in fields(Ask)} == set(SAMPLING_KEYS)
    assert Ask("full", 0.8, "standard").top_p == SearchSection().top_p
    assert PolicyMemberSection.model_fields["template"].annotation == Literal[TEMPLATES] | None  # type: ignore[valid-type]
    for raw in ({"weight": 0.0}, {"temperature": -1.0}, {"top_p": 1.5}, {"template": "fancy"}, {"edit_format": "x"}):
        with pytest.raises(ValueError):
            PolicyMemberSection.model_validate({"spec": "embedded", **raw})
        with pytest.raises(MemberError, match=str(next(iter(raw)))):
            MemberSpec.from_dict({"spec": "embedded", **raw})
    for source in ("evolve/members.py", "evolve/ask_arms.py"):
        tree = ast.parse(Path(source).read_text())
        written = [
            ast.unparse(n)
            for n in ast.walk(tree)
            if (isinstance(n, ast.Tuple) and any(getattr(e, "value", None) == "temperature" for e in n.elts))
            or (isinstance(n, ast.Constant) and n.value in (0.95, "diff"))
        ]
        assert written == [], f"{source} writes a member setting's keys or values again: {written}"
