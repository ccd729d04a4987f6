"""Pick a sandbox backend by name: `process`, `docker`, or `auto` (Docker when a daemon answers)."""

from __future__ import annotations

from sandboxes.base import Sandbox


class SandboxUnavailable(Exception):
    pass


def make_sandbox(kind: str, *, workers: int = 4) -> Sandbox:
    if kind not in ("auto", "process", "docker"):
        raise SandboxUnavailable(f"unknown sandbox {kind!r}; use auto, docker or process")
    if kind in ("auto", "docker"):
        from sandboxes.docker_pool import DockerSandbox, docker_available

        reason = docker_available()
        if reason is None:
            return DockerSandbox(workers=workers)
        if kind == "docker":
            raise SandboxUnavailable(
                f"--sandbox docker: {reason}; start the Docker daemon (dockerd) or pass --sandbox process"
            )
    from sandboxes.process import ProcessSandbox

    return ProcessSandbox(slots=workers)
