"""The zygote of a warm sandbox container: the clean process that every candidate is forked from.

Stdlib only; runs inside the container. The runner forks it before it reads any job, so it holds the warm
interpreter and harness and never a byte of a job. Forked from the runner itself, as candidates once were, a
candidate inherited the heap through which earlier jobs' code, inputs, output and replies had passed, and
could find them by scanning its own memory. Now the runner hands the zygote nothing but the new candidate's
pipe ends (descriptors over a Unix socket); the candidate, once forked, reads its job from its own pipe.

Protocol (one SOCK_SEQPACKET message each; descriptors travel as SCM_RIGHTS):
    runner -> zygote  b"run" with [reply_w, out_w, err_w, job_r]
    zygote -> runner  b"pid" with [pidfd of the candidate]  (the runner SIGKILLs it through that at the deadline)
    runner -> zygote  b"clean", once the candidate has exited (or the runner has killed it)
    zygote -> runner  b"exit" + EXIT: the candidate's wait status, and whether every process of the candidate
                      uid is gone (killed and reaped) and its System V IPC objects removed
The job pipe starts with HEADER (the limits to apply and whether to exec a fresh interpreter), then the job
as one JSON line, which the harness reads after the candidate has become the unprivileged uid.

Nothing outlives its job. The zygote is the child subreaper of everything its candidates make: orphans and
children made with clone(CLONE_PARENT) all become its children, so it reaps them whoever made them, and once
it has no child left no process of the job exists. After each job that left one, it has the job killer
(`job_killer.py`) call kill(-1, SIGKILL) as the candidate uid, which no fork can outrun, and reaps until it
has no child, within a bounded time; when something is still alive then, the runner says the container is
dirty and the engine replaces it.
"""

import contextlib
import ctypes
import os
import resource
import socket
import struct
import sys

import harness  # pre-imported so that forked candidates start warm
import job_killer

HEADER = struct.Struct("<dQQ?")  # timeout_s, memory_mb, max_file_mb, spawn
EXIT = struct.Struct("<i?d")  # the candidate's wait status, every process of the uid gone, CPU seconds reaped
REPLY_FD = 3  # where the candidate finds its reply pipe
PR_SET_CHILD_SUBREAPER = 36


def read_exactly(fd, size):
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError("the job pipe closed early")
        data += chunk
    return data


def cpu_limit_s(timeout_s):
    """The candidate's soft RLIMIT_CPU (SIGXCPU); the hard one, a second later, is SIGKILL."""
    return int(timeout_s) + 2


def become_candidate(fds, uid):
    """In a fresh fork of the zygote: take the limits, keep only the candidate's own descriptors, drop to
    `uid`, then run the job (or exec a fresh interpreter for it, in spawn mode). Never returns."""
    reply_w, out_w, err_w, job_r = fds
    os.setsid()
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")  # the memory cgroup's OOM killer takes candidates first, never the runner or zygote
    timeout_s, memory_mb, max_file_mb, spawn = HEADER.unpack(read_exactly(job_r, HEADER.size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    cpu = cpu_limit_s(timeout_s)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_mb << 20,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20,) * 2)
    os.dup2(job_r, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    # The candidate keeps stdin/stdout/stderr and its reply pipe, nothing else: not the zygote's socket, and
    # none of the runner's descriptors, on which a forged line would be taken for a later job's answer.
    if reply_w != REPLY_FD:
        os.dup2(reply_w, REPLY_FD)
    os.closerange(REPLY_FD + 1, 1 << 20)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != uid:
        raise SystemExit("zygote: could not drop to the candidate uid")
    os.chdir("/work")
    if spawn:
        os.execv(sys.executable, [sys.executable, "-I", "-B", harness.__file__, str(REPLY_FD)])
    harness.serve(REPLY_FD)
    os._exit(0)


def remove_sysv_ipc(uid):
    """Remove every System V shared memory segment, message queue and semaphore set of `uid`.

    They outlive the processes that made them, so a candidate could hold memory or signal later jobs. Only
    their creator's uid (or CAP_SYS_ADMIN, which the container lacks) may remove them: a fork that becomes that
    uid removes them all, once every process of that uid is gone (none could stop it then).
    """
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            for kind, remove in (
                ("shm", lambda i: libc.shmctl(i, 0, None)),  # 0 is IPC_RMID
                ("msg", lambda i: libc.msgctl(i, 0, None)),
                ("sem", lambda i: libc.semctl(i, 0, 0)),
            ):
                with contextlib.suppress(OSError), open(f"/proc/sysvipc/{kind}") as f:
                    for line in f.readlines()[1:]:
                        fields = line.split()
                        if len(fields) > 1 and fields[1].isdigit():
                            remove(int(fields[1]))
            code = 0
        finally:
            os._exit(code)
    os.waitpid(pid, 0)


def reap_until(pid):
    """Reap every child that exits (orphans and CLONE_PARENT children of the candidate too, which would
    otherwise hold pids until the container's limit is spent) until `pid` does; its wait status, and the CPU
    seconds of everything reaped (each process's own and its reaped children's): a death by SIGXCPU is a
    timeout only if that much CPU was spent, not because a candidate sent itself the signal."""
    cpu_s = 0.0
    while True:
        reaped, status, usage = os.wait4(-1, 0)
        cpu_s += usage.ru_utime + usage.ru_stime
        if reaped == pid:
            return status, cpu_s


def sysv_ipc_left():
    """Whether System V IPC objects exist (nothing but candidates makes any): removing them costs a fork."""
    for kind in ("shm", "msg", "sem"):
        with contextlib.suppress(OSError), open(f"/proc/sysvipc/{kind}") as f:
            if len(f.readlines()) > 1:  # a header line, then one per object
                return True
    return False


def run_one(sock, fds, uid, ask_kill):
    """Fork one candidate, hand the runner its pidfd, reap it; once the runner says it is done (b"clean"),
    kill and reap whatever the job left, remove its IPC objects, and report.

    A function of its own, so that nothing of this job (not even its pid) stays in a frame of the zygote's loop
    for a later candidate to walk up to. The zygote reads nothing a candidate wrote.
    """
    pid = os.fork()
    if pid == 0:
        try:
            become_candidate(fds, uid)
        finally:
            os._exit(1)
    pidfd = os.pidfd_open(pid)  # the zygote reaps the candidate, so the pid cannot be reused first
    for fd in fds:
        os.close(fd)
    socket.send_fds(sock, [b"pid"], [pidfd])
    os.close(pidfd)
    status, cpu_s = reap_until(pid)
    if sock.recv(16) != b"clean":
        os._exit(0)  # the runner is gone
    gone = job_killer.kill_leftovers(ask_kill, uid)
    if gone and sysv_ipc_left():
        remove_sysv_ipc(uid)
    sock.sendall(b"exit" + EXIT.pack(status, gone, cpu_s))


def serve(sock, uid, ask_kill):
    """The zygote's loop: one candidate at a time, until the runner closes its end. Never returns."""
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 16, 4)
        if message != b"run" or len(fds) != 4:  # the runner is gone (or confused): end, and it sees us gone
            os._exit(0)
        run_one(sock, fds, uid, ask_kill)
        del message, fds


def start(uid):
    """Fork the job killer, then the zygote; the runner's end of the zygote's socket. Call before any job is read."""
    ask_kill = job_killer.start_killer(uid)
    runner_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            runner_end.close()
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)  # the runner's job channel is not even readable here
            os.dup2(devnull, 1)
            keep = sorted((zygote_end.fileno(), ask_kill))
            os.closerange(3, keep[0])
            os.closerange(keep[0] + 1, keep[1])
            os.closerange(keep[1] + 1, 1 << 20)
            if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                os._exit(1)  # without it orphans would escape its reaping and its count: no job may run
            serve(zygote_end, uid, ask_kill)
        finally:
            os._exit(code)
    zygote_end.close()
    os.close(ask_kill)
    return runner_end
