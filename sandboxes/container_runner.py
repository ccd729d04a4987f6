"""Main process of a warm sandbox container: runs one job at a time, each in a fresh unprivileged child.

Stdlib only. Speaks JSON lines: a job on stdin, one reply on stdout. Per job it forks (or, in spawn mode,
execs a fresh interpreter), lowers the child to an unprivileged uid with rlimits and a high OOM score, reads
its reply and output through capped pipes, then kills every process of that uid and wipes the scratch dirs,
so nothing a candidate leaves behind can touch the next job.
"""

import contextlib
import json
import os
import resource
import select
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # pre-imported so that forked children start warm

UID = int(os.environ.get("EVOLVE_SANDBOX_UID", "1000"))
SCRATCH = ("/work", "/tmp", "/dev/shm", "/dev/mqueue")  # POSIX message queues live on in /dev/mqueue
OUTPUT_CAP = 64 * 1024
REPLY_CAP = 8 * 1024 * 1024
REPLY_FD = 3


def wipe():
    for top in SCRATCH:
        for root, dirs, files in os.walk(top, topdown=False):
            for name in files + dirs:
                path = os.path.join(root, name)
                with contextlib.suppress(OSError):
                    os.rmdir(path) if name in dirs and not os.path.islink(path) else os.unlink(path)


def remove_sysv_ipc():
    """Remove every System V shared memory segment, message queue and semaphore set of the container.

    They outlive the processes that made them, so a candidate could hold memory or signal later jobs. The
    runner may not remove another uid's objects (that takes CAP_SYS_ADMIN), but their creator may: a child
    that becomes the candidate's uid removes them all. The runner itself makes none.
    """
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            os.setgroups([])
            os.setgid(UID)
            os.setuid(UID)
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


def all_threads_dead(pid):
    """"Z" in /proc/PID/stat only means the leader thread exited; other threads may still run."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                    return False
        except OSError:
            pass
    return True


def kill_uid():
    for _ in range(100):
        found = False
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}").st_uid != UID:
                        continue
                    os.kill(int(entry), signal.SIGKILL)  # harmless on a zombie; kills every thread of a process
                    if not all_threads_dead(entry):
                        found = True
                except OSError:
                    pass
        if not found:
            return
        time.sleep(0.005)


def reap():
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def child(job, reply_w, out_w, err_w, job_r):
    os.setsid()
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    limits = job["limits"]
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    cpu = int(limits["timeout_s"]) + 2
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["max_file_mb"] << 20,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    mem = limits["memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    os.dup2(job_r, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    # The candidate keeps stdin/stdout/stderr and its reply pipe (as fd 3), nothing else: above all not the
    # runner's channel to the engine, on which a forged line would be taken for a later job's answer.
    if reply_w != REPLY_FD:
        os.dup2(reply_w, REPLY_FD)
    os.closerange(REPLY_FD + 1, 1 << 20)
    reply_w = REPLY_FD
    os.setgroups([])
    os.setgid(UID)
    os.setuid(UID)
    os.chdir("/work")
    if job.get("spawn"):
        os.execv(sys.executable, [sys.executable, "-I", "-B", harness.__file__, str(reply_w)])
    harness.empty_stdin()
    reply = harness.run_job(job)
    os.write(reply_w, (json.dumps(reply, allow_nan=True, default=str) + "\n").encode())
    os._exit(0)


def prepare(job):
    for name, text in job.pop("files").items():
        path = os.path.join("/work", name)
        with open(path, "w") as f:
            f.write(text)
        os.chown(path, UID, UID)
    os.chown("/work", UID, UID)


def run(job):
    prepare(job)
    reply_r, reply_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    job_r, job_w = os.pipe()
    os.set_inheritable(reply_w, True)
    pid = os.fork()
    if pid == 0:
        for fd in (reply_r, out_r, err_r, job_w):
            os.close(fd)
        try:
            child(job, reply_w, out_w, err_w, job_r)
        finally:
            os._exit(1)
    for fd in (reply_w, out_w, err_w, job_r):
        os.close(fd)
    if job.get("spawn"):
        os.write(job_w, (json.dumps(job) + "\n").encode())
    os.close(job_w)
    buffers = {reply_r: [], out_r: [], err_r: []}
    caps = {reply_r: REPLY_CAP, out_r: OUTPUT_CAP, err_r: OUTPUT_CAP}
    kept = dict.fromkeys(buffers, 0)
    deadline = time.monotonic() + job["limits"]["timeout_s"]
    # Stop when the child exits, not at EOF: an orphan may hold the output pipes open for ever.
    pidfd = os.pidfd_open(pid)
    status, open_fds, exited = None, set(buffers), False
    while open_fds:
        left = 0.0 if exited else deadline - time.monotonic()
        if left <= 0 and not exited:
            status = "timeout"
            break
        watch = [*open_fds] if exited else [*open_fds, pidfd]
        ready, _, _ = select.select(watch, [], [], left)
        if not ready:  # the deadline passed, or the exited child's output is drained
            status = None if exited else "timeout"
            break
        for fd in ready:
            if fd == pidfd:
                exited = True
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
            elif kept[fd] < caps[fd]:
                buffers[fd].append(chunk[: caps[fd] - kept[fd]])
                kept[fd] += len(buffers[fd][-1])
    os.close(pidfd)
    if status is None:
        _, code = os.waitpid(pid, 0)
        status = (
            f"exit {os.waitstatus_to_exitcode(code)}"
            if os.WIFEXITED(code)
            else (
                "timeout" if os.WTERMSIG(code) == signal.SIGXCPU else f"signal {signal.Signals(os.WTERMSIG(code)).name}"
            )
        )
    kill_uid()
    reap()
    for fd in buffers:
        os.close(fd)
    wipe()
    remove_sysv_ipc()
    raw = b"".join(buffers[reply_r])
    try:
        reply = json.loads(raw) if raw else None
    except (ValueError, RecursionError):  # a deeply nested reply is bad output, not a runner error
        reply = {"kind": "bad_output", "error": "the reply was not JSON (or nested too deeply)"}
    return {
        "reply": reply,
        "status": status,
        "stdout": b"".join(buffers[out_r]).decode(errors="replace"),
        "stderr": b"".join(buffers[err_r]).decode(errors="replace"),
    }


def main():
    """Answer each job with one line carrying the job's nonce: the engine takes no other line as an answer."""
    channel = os.fdopen(os.dup(1), "w")
    os.set_inheritable(channel.fileno(), False)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    channel.write(json.dumps({"ready": True}) + "\n")
    channel.flush()
    for line in sys.stdin:
        nonce = None
        try:
            job = json.loads(line)
            nonce = job.pop("nonce", None)
            answer = run(job)
        except Exception as exc:  # the runner must outlive anything a job does
            answer = {"reply": None, "status": f"runner error: {exc!r}", "stdout": "", "stderr": ""}
        answer["nonce"] = nonce
        channel.write(json.dumps(answer, allow_nan=True) + "\n")
        channel.flush()


if __name__ == "__main__":
    main()
