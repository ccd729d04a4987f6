"""The declared dependencies are complete: the package, installed into a fresh virtual environment that can see
only what `pyproject.toml` declares (core plus the `model` extra), imports every one of its modules.

Nothing is downloaded (torch alone is gigabytes): the venv has no system site-packages; the distributions that
the declared requirements resolve to, transitively, are taken from this interpreter's site-packages and exposed
to it through one `.pth` directory of links. A module importing an undeclared package (scipy, before it was
declared) fails to import there.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("evolve", "policies", "sandboxes")
# what scripts/setup.sh installs besides dev/embedded
INSTALLED_EXTRAS = ("model", "report", "postgres", "ray", "server")
OTHER_EXTRAS = ("vllm",)  # the `vllm` extra: only policies/vllm_local.py, inside its functions
# imported only inside functions, by the modules of extras that setup.sh may lack: vllm, and llama-cpp-python
# (the `llama` extra: policies/llama_runtime.py; setup.sh builds it and goes on without it when it cannot)
LAZY_IMPORTS = (*OTHER_EXTRAS, "llama_cpp")


def _closure(requirements: list[str], extras: set[str]) -> dict[str, md.Distribution]:
    """Installed distributions the requirements resolve to, with their own requirements, transitively."""
    found: dict[str, md.Distribution] = {}
    todo = [(Requirement(r), extras) for r in requirements]
    while todo:
        req, active = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (active or {""})):
            continue
        name = canonicalize_name(req.name)
        if name in found:
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            pytest.fail(f"{req.name} is declared (or required by a declared package) but not installed here")
        found[name] = dist
        todo += [(Requirement(r), set(req.extras)) for r in dist.requires or []]
    return found


def _top_level(dist: md.Distribution) -> set[str]:
    """The top-level entries of site-packages a distribution owns: packages, modules and its metadata folder."""
    names = set()
    for f in dist.files or []:
        first = f.parts[0]
        top_file = len(f.parts) == 1
        if first in ("..", "__pycache__") or first.endswith(".pth") or (top_file and f.suffix not in (".py", ".so")):
            continue
        names.add(first)
    return names


def _link_dependencies(target: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = list(project["dependencies"]) + [r for e in INSTALLED_EXTRAS for r in extras[e]]
    target.mkdir()
    for dist in _closure(declared, set()).values():
        site = Path(str(dist.locate_file("")))
        for name in _top_level(dist):
            if (site / name).exists() and not (target / name).exists():
                (target / name).symlink_to(site / name)


def test_a_fresh_venv_with_only_the_declared_dependencies_imports_every_module(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", ".venv"))
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), "."],
        cwd=source,
        check=True,
    )
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    deps = tmp_path / "deps"
    _link_dependencies(deps)
    (site / "declared-deps.pth").write_text(f"{deps}\n")
    (wheel,) = wheels.glob("*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
    )
    check = f"""
import ast, importlib, pkgutil, sys
from pathlib import Path
OPTIONAL = {LAZY_IMPORTS!r}  # packages only other extras declare: imported lazily, on the paths that need them
failed, imported = [], set()
for top in {PACKAGES!r}:
    package = importlib.import_module(top)
    assert "site-packages" in package.__file__, package.__file__  # the installed copy, not the source tree
    for info in pkgutil.walk_packages(package.__path__, top + "."):
        if info.name.endswith(".__main__") or ".migrations." in info.name:  # run by the CLI and by Alembic
            continue
        try:
            module = importlib.import_module(info.name)
        except Exception as exc:
            failed.append(f"{{info.name}}: {{type(exc).__name__}}: {{exc}}")
            continue
        # every import in the file, also those inside functions (scipy's was one)
        for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
            if isinstance(node, ast.Import):
                imported |= {{(info.name, a.name.split(".")[0]) for a in node.names}}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add((info.name, node.module.split(".")[0]))
for where, name in sorted(imported):
    if name in sys.stdlib_module_names or name in {PACKAGES!r} or name in OPTIONAL:
        continue
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{{where}} imports {{name}}: {{type(exc).__name__}}: {{exc}}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run([python, "-c", check], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    cli = subprocess.run([env_dir / "bin" / "evolve", "--help"], env=env, capture_output=True, text=True)
    assert cli.returncode == 0 and "run" in cli.stdout, cli.stdout[-600:] + cli.stderr
