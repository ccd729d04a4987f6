"""Pick a sandbox backend by name: `process`, `docker`, or `auto` (Docker when a daemon answers)."""

from __future__ import annotations

from sandboxes.base import Sandbox


class SandboxUnavailable(Exception):
    pass


def make_sandbox(kind: str, *, workers: int = 4) -> Sandbox:
    if kind not in ("auto", "process", "docker"):
        raise SandboxUnavailable(f"unknown sandbox {kind!r}; use auto, docker or process")
    if kind in ("auto", "docker"):
        try:
            from sandboxes.docker_pool import DockerSandbox, docker_available
        except ImportError:
            docker_available = None
        if docker_available is not None and (reason := docker_available()) is None:
            return DockerSandbox(workers=workers)
        if kind == "docker":
            raise SandboxUnavailable(
                f"--sandbox docker: {reason if docker_available else 'Docker backend not installed'}; "
                "start the Docker daemon (dockerd) or pass --sandbox process"
            )
    from sandboxes.process import ProcessSandbox

    return ProcessSandbox(slots=workers)
