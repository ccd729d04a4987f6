"""`evolve sandbox build-base`: make the Docker sandbox's base image without any registry."""

from __future__ import annotations

import typer

from evolve.cli.common import console, fail

sandbox_app = typer.Typer(no_args_is_help=True, help="Docker sandbox images.")


@sandbox_app.command("build-base")
def build_base_cmd() -> None:
    """Import an empty image that runs the host's Python through read-only bind mounts (no pull needed)."""
    from sandboxes.docker_images import build_base
    from sandboxes.docker_pool import docker_available

    reason = docker_available()
    if reason is not None:
        fail(f"{reason}; start the Docker daemon (dockerd) first")
    import docker

    spec = build_base(docker.from_env())
    binds = ", ".join(spec.binds)
    console.print(f"built {spec.tag} (python {spec.python}; read-only binds {binds})", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.add_typer(sandbox_app, name="sandbox")
