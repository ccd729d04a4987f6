"""Where the programs a native problem's `[build]` and `[run]` commands name come from, inside a sandbox.

A tool under /usr (gcc, cc, make, Debian's rustc) is in every sandbox already: the jail and the host base image
bind the host's /usr read-only. A tool elsewhere (rustup's toolchains under ~/.rustup, a compiler unpacked in
/opt) is bound read-only at TOOLCHAIN_INSIDE/N: the folders of the folder above its `bin/` (where such toolchains
keep their libraries and standard library; not the files at its top, such as a pip.conf), and the command is
rewritten to the tool's path there; where that folder is /, a home folder, a hidden folder in one (~/.local/bin,
~/.cargo/bin) or holds the problem (a script in ~/bin), the tool's file alone is bound. Besides these and
/etc/alternatives (read-only links into /usr) nothing of the host comes in: not the home folder the toolchain
lives in, not its PATH, not rustup's settings.

rustup installs proxies (~/.cargo/bin/rustc is a link to `rustup`) that need RUSTUP_HOME and a home folder to
pick a toolchain; `rustup which` names the real tool once, on the host, and that toolchain is bound instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from evolve.problem import Problem
from sandboxes.jail import PREFIX_CONFIG

TOOLCHAIN_INSIDE = "/opt/toolchain"
SYSTEM_PREFIXES = ("/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/")
# Debian reaches many tools through these links (/usr/bin/cc -> /etc/alternatives/cc -> /usr/bin/gcc; rustc
# links with `cc`): bound read-only for every native problem, since /usr alone would hold dangling links.
ALTERNATIVES = "/etc/alternatives"


@dataclass(frozen=True)
class Toolchain:
    """Read-only binds a sandbox adds for a problem's tools, and the paths its commands start them by."""

    binds: tuple[tuple[str, str], ...] = ()  # (host folder, path inside the sandbox)
    programs: tuple[tuple[str, str], ...] = ()  # (name as problem.toml writes it, path to start it by)

    def argv(self, command: list[str]) -> list[str]:
        return [dict(self.programs).get(command[0], command[0]), *command[1:]]


def _real_tool(name: str) -> Path | None:
    """The file `name` starts on this host's PATH, past links and rustup's proxies; None when not found."""
    found = shutil.which(name)
    if found is None:
        return None
    real = Path(found).resolve()
    if real.name == "rustup" and name != "rustup":
        try:
            out = subprocess.run([str(real), "which", name], capture_output=True, text=True, timeout=30, check=True)
        except (OSError, subprocess.SubprocessError):
            return real
        real = Path(out.stdout.strip()).resolve()
    return real


def _is_home(folder: Path) -> bool:
    return folder in (Path("/root"), Path.home().resolve()) or folder.parent == Path("/home")


def _shared_folder(root: Path, problem_root: Path) -> bool:
    """True for a folder that holds more than a toolchain: /, a home folder, a hidden folder in one, or one
    holding the problem. `pip install --user`, pipx and `cargo install` put tools in ~/.local/bin and
    ~/.cargo/bin, beside the user's own data (~/.local/share) and tokens (~/.cargo/credentials.toml): bound
    whole, ~/.local was a candidate's to read at /opt/toolchain/0."""
    hidden_in_home = root.name.startswith(".") and _is_home(root.parent)
    return root == Path("/") or _is_home(root) or hidden_in_home or problem_root.is_relative_to(root)


def _parts(root: Path, tool: Path, where: str) -> list[tuple[str, str]]:
    """Binds bringing in `root` at `where`: a lone file as it is; a folder by its folders and the tool itself,
    never the other files at its top. pip reads `{sys.prefix}/pip.conf` (conda `.condarc`), so a Python
    installation taken for a build's toolchain showed its index token at /opt/toolchain/N/pip.conf. A link to a
    folder outside the toolchain stays out too, and so do its `etc` (an nvm node keeps its npm token in
    etc/npmrc) and conda's `envs` (other environments, each with its own pip.conf and etc)."""
    if not root.is_dir():
        return [(str(root), where)]
    try:
        entries = sorted(root.iterdir())
    except PermissionError:  # crossed but not listed (an ACL granting `--x`): the usual folders of a toolchain
        entries = [root / name for name in ("bin", "include", "lib", "lib64", "libexec", "share")]
    parts = [
        (str(entry), f"{where}/{entry.name}")
        for entry in entries
        if entry.is_dir() and entry.resolve().is_relative_to(root) and entry.name not in (PREFIX_CONFIG, "envs")
    ]
    return parts + ([(str(tool), f"{where}/{tool.name}")] if tool.parent == root else [])


@cache
def _resolve(names: tuple[str, ...], inside: bool, problem_root: Path) -> Toolchain:
    roots: dict[Path, str] = {}
    binds: dict[str, str] = {}
    programs: list[tuple[str, str]] = []
    for name in names:
        real = _real_tool(name)
        if real is None or str(real).startswith(SYSTEM_PREFIXES):
            continue  # not found (the build says so) or under /usr: the sandbox's PATH finds it
        if not inside:  # the host's files are visible (the WEAK process sandbox): start it by its host path
            programs.append((name, str(real)))
            continue
        root = real.parent.parent if real.parent.name == "bin" else real.parent
        if _shared_folder(root, problem_root):  # ~/bin/tool: the tool alone, never the home folder around it
            root = real
        if root not in roots:
            roots[root] = f"{TOOLCHAIN_INSIDE}/{len(roots)}"
        where = roots[root]
        binds.update(_parts(root, real, where))
        programs.append((name, where if root == real else f"{where}/{real.relative_to(root)}"))
    if inside and os.path.isdir(ALTERNATIVES):
        binds[ALTERNATIVES] = ALTERNATIVES
    return Toolchain(tuple(binds.items()), tuple(programs))


def host_toolchain(problem: Problem, *, inside: bool = True) -> Toolchain:
    """The binds and command paths for `problem`'s tools taken from this host (none for a Python problem).

    `inside` False: the sandbox shows the host's own files, so tools are started by their host paths."""
    config = problem.config
    if config.run is None:
        return Toolchain()
    commands = [config.run.command] + ([config.build.command] if config.build is not None else [])
    names = tuple(sorted({c[0] for c in commands if os.sep not in c[0] or os.path.isabs(c[0])}))
    return _resolve(names, inside, problem.root.resolve())
