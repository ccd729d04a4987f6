"""Command-line flags made from the options model (evolve/options.py): name, type, help, default note, bounds and a
switch's two spellings come from the `RunOptions` field, so `evolve run`, `evolve resume` and `evolve train` show
the same flag the same way and none of them restates a default or a bound. A command that takes an option in its
own way (`evolve train --method` for `train_method`; its `--policy` defaulting to the run's) says only that
(`Borrowed`); the rest is still the field's."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, fields
from typing import Annotated, Any

import typer

from evolve.cli.common import default_note
from evolve.options import RunOptions, bound_text, meta, option_default

_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


@dataclass(frozen=True)
class Borrowed:
    """How a command other than `evolve run` shows one option, where it differs: under another flag (`evolve train
    --method`), or with a default the command works out itself (the run's policy), said in the help."""

    flag: str | None = None
    default: str | None = None


def _flag(f: Field[Any]) -> str:
    return meta(f).flag or f.name.replace("_", "-")


def _help(f: Field[Any], resume: bool, borrowed: Borrowed | None = None) -> str:
    info = meta(f)
    text = (info.resume_help if resume else None) or info.help
    if info.choices:
        text = f"{' | '.join(info.choices)}: {text}"
    if info.low is not None or info.high is not None:
        low, high = ("" if v is None else bound_text(v) for v in (info.low, info.high))
        text = f"{text} ({low}..{high})"
    if borrowed is not None and borrowed.default is not None:
        return f"{text} {default_note(borrowed.default)}"
    if info.section:
        table = rf"the problem's \[{info.section}] value, else {option_default(f.name)}"
        return f"{text} {default_note(table)}"
    default = option_default(f.name)
    return text if default is None or resume else f"{text} {default_note(default)}"


def parameter(f: Field[Any], resume: bool = False, borrowed: Borrowed | None = None) -> inspect.Parameter:
    """The Typer parameter of one option: keyword-only, None when not given."""
    info = meta(f)
    kind = _TYPES[str(f.type).removesuffix(" | None")]
    flag = (borrowed.flag if borrowed else None) or _flag(f)
    decls = [f"--{flag}/--{info.negative or 'no-' + flag}"] if kind is bool else [f"--{flag}"]
    # bounds are checked in one line (invalid_value)
    flag_option = typer.Option(*decls, help=_help(f, resume, borrowed))
    annotation = Annotated[kind | None, flag_option]  # type: ignore[valid-type]
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)


def option_parameters(command: str, borrowed: Mapping[str, Borrowed] | None = None) -> list[inspect.Parameter]:
    """The flags of `command` ("run": every option with a flag; "resume": those marked for it), or just the options
    it borrows (by field name, each shown as `Borrowed` says)."""
    out = []
    for f in fields(RunOptions):
        info = meta(f)
        if borrowed is not None:
            if f.name in borrowed:
                out.append(parameter(f, borrowed=borrowed[f.name]))
        elif info.flag is not None and (command == "run" or info.on_resume):
            out.append(parameter(f, resume=command == "resume"))
    return out


def with_flags(
    command: Callable[..., None], own: list[inspect.Parameter], flags: list[inspect.Parameter]
) -> Callable[..., None]:
    """`command` (which takes its own parameters, then the flags as keywords) with a signature Typer reads."""
    command.__signature__ = inspect.Signature([*own, *flags])  # type: ignore[attr-defined]
    command.__annotations__ = {}
    return command
