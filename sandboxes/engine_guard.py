"""Keep the engine's own secrets (environment, open files, memory, command line) from candidates outside a jail.

In the jail a candidate has its own pid namespace and never sees the engine. Outside it (the WEAK process
sandbox) the candidate shares the engine's /proc:
- /proc/ENGINE/environ, fd/, mem, maps, cwd... are guarded by the kernel's ptrace access check: a process of
  another uid is refused, but one of the engine's own uid (an unprivileged engine's candidates, even in a user
  namespace of their own) is let in while the engine is "dumpable". prctl(PR_SET_DUMPABLE, 0) ends that: the
  entries then belong to root and only a process with CAP_SYS_PTRACE over the engine may open them.
  What it costs: no core dump of the engine, and debuggers or profilers attaching to it (gdb -p, py-spy) need
  root. The engine's children get a dumpable process again when they exec, so candidates are unaffected.
- /proc/ENGINE/cmdline is readable by every process that sees the pid, whatever its uid (so by every local
  user too: put no secret on a command line; use the environment). Outside the jail the engine also blanks its
  own arguments in place, leaving argv[0]: Python keeps its own copy in sys.argv, so nothing else changes, but
  `ps` shows only the interpreter's name for this process from then on.
"""

from __future__ import annotations

import ctypes

PR_SET_DUMPABLE = 4
_libc = ctypes.CDLL(None, use_errno=True)


def hide_proc_entries() -> None:
    """Make the engine's /proc entries (environ, fd, mem, maps) unreadable to other processes of its uid."""
    if _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def blank_command_line() -> None:
    """Overwrite the engine's arguments after argv[0] with NULs where the kernel reads /proc/self/cmdline."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    arg_start, arg_end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5), counted from 1
    if not arg_start or arg_end <= arg_start:
        return
    first = ctypes.string_at(arg_start, arg_end - arg_start).split(b"\0", 1)[0]
    keep = len(first) + 1
    if arg_end - arg_start > keep:
        ctypes.memset(arg_start + keep, 0, arg_end - arg_start - keep)


def guard_engine(*, shares_proc: bool) -> None:
    """What every process sandbox does to the engine it runs in; `shares_proc` when candidates see its pid."""
    hide_proc_entries()
    if shares_proc:
        blank_command_line()
