"""Load and validate a problem folder. Every failure is one `ProblemError` line naming the file and the fix."""

from __future__ import annotations

import ast
import os
import shutil
import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from evolve.problem.blocks import BlockError, find_blocks
from evolve.problem.config import ComponentSpec, ProblemConfig
from evolve.problem.errors import ProblemError, doc, shown
from evolve.problem.fingerprint import combined, folder_hashes
from evolve.problem.seed_files import check_fixed_names, folder_file, read_seed_files, read_text
from evolve.problem.trusted import Scored, ScorerError, TrustedScorer


@dataclass(frozen=True)
class Case:
    """One split-form case. Only `input` ever enters the sandbox; the rest stays with the trusted scorer."""

    name: str
    input: Any
    trusted: dict[str, Any] = field(default_factory=dict)


@dataclass
class Problem:
    root: Path
    config: ProblemConfig
    seed_code: str
    form: Literal["simple", "split"]
    components: tuple[ComponentSpec, ...]
    evaluator_path: Path
    cases: tuple[Case, ...] = ()
    _scorer: TrustedScorer | None = None  # cases() and score(), in processes of their own (trusted.py)
    # A program of several files ([program] files): their paths, in the order of its joined text
    # (evolve/filetree.py); empty for a program of one file, whose text is the file's.
    files: tuple[str, ...] = ()

    @property
    def multi_file(self) -> bool:
        return bool(self.files)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def component_names(self) -> list[str]:
        return [c.name for c in self.components]

    @property
    def data_dir(self) -> Path | None:
        d = self.root / "data"
        return d if d.is_dir() else None

    @cached_property
    def file_hashes(self) -> dict[str, str]:
        """Each file of the folder that can decide a score -> its hash, read once (evolve/problem/fingerprint.py);
        a run stores them, and a resume names the files that changed since."""
        return folder_hashes(self.root, self.config.model_dump(mode="json"))

    def fingerprint(self) -> str:
        """One hash of `file_hashes`: a resumed run refuses a changed problem."""
        return combined(self.file_hashes)

    def score_case(self, case: Case, output: Any) -> tuple[float, str | None, bool]:
        """Run the trusted `score(case, output)` -> (score, note, ok).

        Anything odd (a raise, a non-number, NaN or infinity, a call past its deadline) makes the case a failure
        at its fail value with `ok` False, never an exception and never a score that counts as an honest answer.
        """
        [scored] = self.score_outputs([(case, output)])
        if scored.value is None:
            return self.components[self.component_names.index(case.name)].failure, scored.note, False
        return scored.value, scored.note, True

    def score_outputs(self, pairs: list[tuple[Case, Any]]) -> list[Scored]:
        """Score several cases' outputs in one call (one round trip to a scorer process), each within the
        problem's `[limits] timeout_s`; see evolve/problem/trusted.py."""
        assert self._scorer is not None
        position = {c.name: i for i, c in enumerate(self.cases)}
        return self._scorer.score([(position[case.name], output) for case, output in pairs])

    def abort_scoring(self) -> None:
        """Ctrl-C: the `score()` calls running are stopped, and their callers return at once."""
        if self._scorer is not None:
            self._scorer.abort()


def _fail(path: Path, what: str, fix: str) -> ProblemError:
    return ProblemError(f"{path}: {what}; {fix}")


def _top_level_functions(path: Path) -> set[str]:
    try:
        tree = ast.parse(read_text(path, "save the evaluator as UTF-8 text"), filename=str(path))
    except SyntaxError as exc:
        raise _fail(path, f"syntax error on line {exc.lineno}: {exc.msg}", "fix the evaluator") from None
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def _load_cases(path: Path, scorer: TrustedScorer) -> tuple[Case, ...]:
    """cases(), run by the scorer's first process within its deadline; the validated cases are what every
    scorer process passes to score()."""
    try:
        raw = scorer.load_cases()
    except ScorerError as exc:
        raise _fail(path, str(exc), "fix the evaluator") from None
    if not isinstance(raw, list | tuple) or not raw:
        raise _fail(path, "cases() must return a non-empty list", 'return [{"name": ..., "input": ...}, ...]')
    out = []
    for item in raw:
        if not isinstance(item, dict) or "name" not in item or "input" not in item:
            raise _fail(path, f"case {shown(item)} lacks 'name' or 'input'", "give each case both keys")
        rest = {k: v for k, v in item.items() if k not in ("name", "input")}
        out.append(Case(str(item["name"]), item["input"], rest))
    scorer.use_cases([{"name": c.name, "input": c.input, **c.trusted} for c in out])
    return tuple(out)


def _foreign_openevolve_program(root: Path) -> str | None:
    """The name of an OpenEvolve seed in another language (initial_program.rs, .R) beside evaluator.py."""
    if not (root / "evaluator.py").is_file() or (root / "initial_program.py").is_file():
        return None
    return next((p.name for p in sorted(root.glob("initial_program.*"))), None)


def _check_tools(toml_path: Path, config: ProblemConfig) -> None:
    """Every program a [build] or [run] command starts by name or absolute path must exist on this machine
    (sandboxes/toolchain.py binds it into the sandbox); without a Dockerfile nothing else would provide it."""
    commands = {
        "run": config.run.command if config.run else None,
        "build": config.build.command if config.build else None,
    }
    for section, command in commands.items():
        if command and (os.sep not in command[0] or os.path.isabs(command[0])) and shutil.which(command[0]) is None:
            raise _fail(
                toml_path,
                f"[{section}] command: {command[0]!r} is not installed here (not on PATH)",
                "install it, or add a Dockerfile whose image has it",
            )


def load_problem(folder: str | Path) -> Problem:
    root = Path(folder).resolve()
    toml_path = root / "problem.toml"
    if not root.is_dir():
        raise ProblemError(f"{root}: not a directory; pass a problem folder (evolve init DIR makes one)")
    if not toml_path.is_file():
        foreign = _foreign_openevolve_program(root)
        if foreign is not None:
            raise ProblemError(
                f"{root}: an OpenEvolve folder whose program is {foreign}, not Python: not run as it is (its "
                "evaluator.py builds and runs it with tools of the host, e.g. cargo or Rscript, which the sandbox "
                "does not have); write a problem.toml with [program] language, [build] and [run] "
                "(evolve init --language rust DIR writes one)"
            )
        raise _fail(toml_path, "missing", "create it (evolve init DIR shows the format)")
    check_fixed_names(root)  # problem.toml, data/ and Dockerfile: none a link out of the folder
    try:
        raw = tomllib.loads(read_text(toml_path))
    except tomllib.TOMLDecodeError as exc:
        raise _fail(toml_path, f"invalid TOML ({exc})", "fix the syntax") from None
    except RecursionError:
        raise _fail(toml_path, "invalid TOML (arrays or tables nested too deeply)", "fix the syntax") from None
    try:
        config = ProblemConfig.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise _fail(toml_path, f"{where}: {err['msg']}", f"see {doc('problem-format.md')}") from None

    if config.native and not (root / "Dockerfile").is_file():
        _check_tools(toml_path, config)
    files: tuple[str, ...] = ()
    if config.program.files is not None:
        files, seed_code = read_seed_files(root, config.program.files, config.program.entry)
    else:
        seed_path = folder_file(root, config.program.file, "[program] file")
        if not seed_path.is_file():
            raise _fail(root / config.program.file, "seed program missing", "create it or set [program].file")
        seed_code = read_text(seed_path)
        try:
            find_blocks(seed_code)
        except BlockError as exc:
            raise _fail(seed_path, str(exc), "balance the EVOLVE-BLOCK markers") from None

    folder_file(root, config.evaluator.file, "[evaluator] file")  # no link out of the folder
    ev_path = root / config.evaluator.file
    if not ev_path.is_file():
        raise _fail(ev_path, "evaluator missing", "create it or set [evaluator].file")
    functions = _top_level_functions(ev_path)
    form = config.evaluator.form
    if form == "auto":
        form = "split" if {"cases", "score"} <= functions else "simple"
    components = config.fitness.resolved()
    problem = Problem(root, config, seed_code, form, components, ev_path, files=files)
    if form == "simple":
        if "evaluate" not in functions:
            raise _fail(ev_path, "no evaluate(program_path) function", "define it, or cases() and score()")
        return problem
    missing = {"cases", "score"} - functions
    if missing:
        raise _fail(ev_path, f"split form needs {', '.join(sorted(missing))}()", "define cases() and score()")
    problem._scorer = TrustedScorer(ev_path, config.limits.timeout_s)
    problem.cases = _load_cases(ev_path, problem._scorer)
    case_names = [c.name for c in problem.cases]
    if case_names != problem.component_names:
        extra = sorted(set(case_names) - set(problem.component_names))[:3]
        lacking = sorted(set(problem.component_names) - set(case_names))[:3]
        raise _fail(
            ev_path,
            f"cases() names {len(case_names)} cases but problem.toml declares {len(components)} components"
            f" (unknown {extra}, missing {lacking}, or a different order)",
            "make [fitness] list the case names in the same order",
        )
    return problem
