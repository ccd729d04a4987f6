"""The run's options are declared once (evolve/options.py): the flags of `evolve run`, `evolve resume` and
`evolve train`, their help, defaults and bounds, `RunOverrides` and the problem's `[search]` defaults all come from
`RunOptions`, so none of them can drift from it."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import typer
from typer.testing import CliRunner

from evolve.cli import app
from evolve.options import RunOptions, RunOverrides, bound_text, meta
from evolve.problem.config import SearchSection, TrainingSection


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
