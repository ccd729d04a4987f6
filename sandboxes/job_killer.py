"""Inside a sandbox container: kill and reap every process a job left, however fast it forks.

Stdlib only; runs inside the container, beside `zygote.py`. Listing /proc and killing what it shows can be
outrun: a chain of processes that each clone a successor and exit moves to a new pid between the listing and
the kill. kill(-1, SIGKILL) cannot be: the kernel signals every process the caller may signal while holding
the task list, and a fork that has not finished by then is cancelled by the SIGKILL pending on its parent.

So the container keeps a killer process, forked by the runner before the zygote (never the zygote's child,
never holding a job). It waits as root; asked, it becomes the candidate uid in its effective uid only (real
uid `uid + 1`, which no process here has, and saved uid root, to come back), calls kill(-1, SIGKILL), and
becomes root again. kill() lets it signal exactly the processes whose real or saved uid is the candidate's:
the runner and the zygote are root and out of its reach (changing the effective uid dropped its effective
capabilities), and no process of the candidate uid may signal it back, since neither its real nor its saved
uid is theirs. Having forked beforehand, it needs no free pid when a fork bomb has taken them all.

The zygote is the child subreaper of everything its candidates make (orphans and clone(CLONE_PARENT)
children all become its children) and the only maker of processes of the candidate uid: it has no child
exactly when nothing of the job is left. It asks the killer and reaps until then.
"""

import contextlib
import os
import signal
import time

CLEAR_WITHIN_S = 5.0  # SIGKILLed processes die in microseconds; one still alive after this is stuck for good
ASK_AGAIN_S = 0.05  # another kill(-1) only if something lives on this long after the last


def start_killer(uid):
    """Fork the killer (from the runner, before the zygote); the write end of the pipe that asks it to kill."""
    ask_r, ask_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ask_w)
            os.closerange(3, ask_r)
            os.closerange(ask_r + 1, 1 << 20)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1):  # the runner's job and answer channel are not even reachable here
                os.dup2(devnull, fd)
            os.close(devnull)
            os.setgroups([])
            serve_kills(ask_r, uid)
        finally:
            os._exit(0)
    os.close(ask_r)
    os.set_blocking(ask_w, False)  # the zygote never waits on the killer
    return ask_w


def serve_kills(ask_r, uid):
    """The killer's loop: one kill(-1, SIGKILL) as the candidate uid per byte read, until the pipe closes."""
    while os.read(ask_r, 1):
        os.setresuid(uid + 1, uid, 0)
        try:
            if os.geteuid() == uid:
                with contextlib.suppress(OSError):
                    os.kill(-1, signal.SIGKILL)
        finally:
            os.setresuid(0, 0, 0)


def kill_leftovers(ask_w, uid):
    """Kill and reap every process the job left: True once none is left, False if one outlives CLEAR_WITHIN_S.

    A job that left nothing costs one waitpid: no kill is asked for."""
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return True
    deadline = time.monotonic() + CLEAR_WITHIN_S
    next_ask, pause = 0.0, 0.0002
    while True:
        now = time.monotonic()
        if now >= deadline:
            return False
        if now >= next_ask:
            with contextlib.suppress(BlockingIOError):  # kills are queued already
                os.write(ask_w, b"k")  # a killer gone (it never should be) ends in False: a new container
            next_ask = now + ASK_AGAIN_S
        try:
            reaped, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if reaped:
            pause = 0.0002
            continue
        time.sleep(pause)
        pause = min(pause * 2, 0.005)
