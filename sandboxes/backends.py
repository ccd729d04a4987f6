"""Pick a sandbox backend by name: `process`, `docker`, `auto` (Docker when a daemon answers), or `ray` /
`ray:ADDRESS` (evaluations on Ray actors, each with its node's own `auto` sandbox)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandboxes.sandbox import Sandbox

if TYPE_CHECKING:
    from evolve.problem import Problem


class SandboxUnavailable(Exception):
    pass


def make_sandbox(kind: str, *, workers: int = 4) -> Sandbox:
    if kind == "ray" or kind.startswith("ray:"):
        from sandboxes.ray_pool import RaySandbox, RayUnavailable

        try:
            return RaySandbox(kind.partition(":")[2] or None, slots=workers)
        except RayUnavailable as exc:
            raise SandboxUnavailable(str(exc)) from None
    if kind not in ("auto", "process", "docker"):
        raise SandboxUnavailable(f"unknown sandbox {kind!r}; use auto, docker, process, ray or ray:ADDRESS")
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


def weak_sandbox_refusal(sandbox: Sandbox, problem: Problem, allow_weak: bool) -> str | None:
    """Why `sandbox` may not run `problem`'s candidates (one line naming the cause and the fix), or None.

    A split-form problem keeps its expected answers out of the sandbox; a sandbox whose candidates can read the
    host's files (WEAK) would hand them over. Every command that runs candidates asks this same question."""
    if problem.form != "split" or sandbox.hides_files or allow_weak:
        return None
    return (
        f"{sandbox.isolation()}; candidates could read {problem.name}'s expected answers. "
        "Install bubblewrap or start Docker, or pass --allow-weak-sandbox to accept this"
    )
