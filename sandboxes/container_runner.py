"""Main process of a warm sandbox container: runs one job at a time, each in a fresh unprivileged process.

Stdlib only. Speaks JSON lines: a job on stdin, one reply on stdout. Before it reads any job it forks the
zygote (`zygote.py`), from which every candidate is forked: a candidate's address space never held another
job. Per job it writes the job's files (root's, read-only, in the sticky scratch folder), hands the zygote the
new candidate's pipe ends, feeds the job down the candidate's own pipe and reads its reply and output through
capped pipes; then the zygote kills and reaps every process of the job and removes its IPC objects, and only
then does the runner wipe the scratch dirs, so nothing a candidate leaves behind can touch the next job. The
container's memory cgroup caps all its processes together; a job during which the cgroup killed a process is
reported, so that it scores `memory` even when the candidate itself lived on.
"""

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zygote  # stdlib only: it runs inside the container

UID = int(os.environ.get("EVOLVE_SANDBOX_UID", "1000"))
SCRATCH = ("/work", "/tmp", "/dev/shm", "/dev/mqueue")  # POSIX message queues live on in /dev/mqueue
OUTPUT_CAP = 64 * 1024
REPLY_CAP = 8 * 1024 * 1024
CPU_SLACK_S = 0.5  # CPU time is accounted in ticks: a process stopped by its limit may show a little less
ZYGOTE_WAIT_S = 30.0  # the zygote answers within milliseconds; silence this long means it is gone
# Where the container's memory cgroup counts its OOM kills: cgroup v2, then v1.
OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def wipe():
    """Empty the scratch mounts; False when something is left (the engine then replaces the container).

    `shutil.rmtree` deletes through directory descriptors, so a tree nested past PATH_MAX (which `os.walk` skips
    in silence) goes too; whatever still survives would hold the tmpfs memory of every later job. It recurses
    once per level: a tree thousands deep raises RecursionError, which is then what survives (the candidate's
    reply stands, and the container is replaced).
    """
    for top in SCRATCH:
        with contextlib.suppress(OSError):
            for entry in os.scandir(top):
                with contextlib.suppress(OSError, RecursionError):
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
    return all(not _entries(top) for top in SCRATCH)


def _entries(top):
    try:
        return os.listdir(top)
    except FileNotFoundError:
        return []
    except OSError:
        return ["?"]


def signal_name(number):
    """SIGKILL for 9; the number for a signal that Python's enum lacks (the real-time ones between SIGRTMIN and
    SIGRTMAX): a candidate that killed itself with one made this runner fail, and the engine ran it again."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def oom_kills():
    """How many processes the container's memory cgroup has OOM-killed so far; None where no counter is readable."""
    for path in OOM_COUNTERS:
        with contextlib.suppress(OSError, ValueError), open(path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return None


def prepare(job):
    """Write the job's files as root's and read-only, in /work owned by root with the sticky bit (as /tmp).

    The candidate may create its own files there, but neither change, rename over nor delete these: whatever a
    process of the candidate uid did, the program that the next candidate runs is the one written here. A file
    already there (which the wipe would have removed) fails the job as a runner error instead of being reused.
    The folders of a program of several files are made the same way (root's, 1777), so that a build can write
    its outputs beside its sources (`cc -c lib/x.c -o lib/x.o`) and still not touch the job's files there.
    """
    os.chown("/work", 0, 0)
    os.chmod("/work", 0o1777)
    made = set()  # folders of a program of several files, made here
    for name, text in job.pop("files").items():
        parts = name.split("/")
        if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"job file {name!r} leaves /work")
        folder = "/work"
        for part in parts[:-1]:
            folder = os.path.join(folder, part)
            if folder not in made:
                os.mkdir(folder, 0o700)  # fails on anything already there, a symlink included
                os.chmod(folder, 0o1777)  # after mkdir, whose mode the umask masks
                made.add(folder)
        fd = os.open(os.path.join(folder, parts[-1]), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
        with open(fd, "w") as f:
            f.write(text)


def from_zygote(channel, expected):
    """The zygote's next message, which must start with `expected`: (rest of it, descriptors)."""
    channel.settimeout(ZYGOTE_WAIT_S)
    message, fds, _, _ = socket.recv_fds(channel, 64, 1)
    if not message.startswith(expected):
        for fd in fds:
            os.close(fd)
        raise RuntimeError(f"the zygote sent {message[:16]!r}, not {expected!r}")
    return message[len(expected) :], fds


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def start_candidate(job, channel):
    """Fork a candidate from the zygote and feed it its job; (pidfd, reply, stdout and stderr read ends)."""
    reply_r, reply_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    job_r, job_w = os.pipe()
    limits = job.pop("limits")
    header = zygote.HEADER.pack(
        float(limits["timeout_s"]), int(limits["memory_mb"]), int(limits["max_file_mb"]), bool(job.pop("spawn", False))
    )
    data = header + (json.dumps(job) + "\n").encode()
    # As much of the job as the pipe holds goes in before anyone else has its other end; the candidate reads
    # it only once it is the candidate uid, so a large job's rest follows once it is forked.
    os.set_blocking(job_w, False)
    try:
        sent = os.write(job_w, data)
    except BlockingIOError:
        sent = 0
    os.set_blocking(job_w, True)
    socket.send_fds(channel, [b"run"], [reply_w, out_w, err_w, job_r])
    for fd in (reply_w, out_w, err_w, job_r):
        os.close(fd)
    _, (pidfd,) = from_zygote(channel, b"pid")
    with contextlib.suppress(BrokenPipeError):  # it died before reading all of it: the rest is moot
        write_all(job_w, data[sent:])
    os.close(job_w)
    return pidfd, reply_r, out_r, err_r


def ended(code, cpu_s, timeout_s):
    """How the candidate ended: its exit code or signal; a timeout where it died of its CPU limit (SIGXCPU, or the
    hard limit's SIGKILL) having spent that CPU, which a candidate that sent itself either has not."""
    if os.WIFEXITED(code):
        return f"exit {os.waitstatus_to_exitcode(code)}"
    number = os.WTERMSIG(code)
    if number in (signal.SIGXCPU, signal.SIGKILL) and cpu_s >= zygote.cpu_limit_s(timeout_s) - CPU_SLACK_S:
        return "timeout"
    return f"signal {signal_name(number)}"


def run(job, channel):
    oom_before = oom_kills()
    timeout_s = job["limits"]["timeout_s"]
    prepare(job)
    pidfd, reply_r, out_r, err_r = start_candidate(job, channel)
    buffers = {reply_r: [], out_r: [], err_r: []}
    caps = {reply_r: REPLY_CAP, out_r: OUTPUT_CAP, err_r: OUTPUT_CAP}
    kept = dict.fromkeys(buffers, 0)
    deadline = time.monotonic() + timeout_s
    # Stop when the candidate has exited and its output is drained, not at EOF: an orphan may hold the output
    # pipes open for ever (and a candidate that closed them may still be running).
    status, open_fds, exited = None, set(buffers), False
    while open_fds or not exited:
        left = 0.0 if exited else deadline - time.monotonic()
        if left <= 0 and not exited:
            status = "timeout"
            break
        watch = [*open_fds] if exited else [*open_fds, pidfd]
        ready, _, _ = select.select(watch, [], [], left)
        if not ready:  # the deadline passed, or the exited candidate's output is drained
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
    if status == "timeout":
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # it may still be root, before its uid drop
    os.close(pidfd)
    channel.sendall(b"clean")  # the zygote kills and reaps every process of the job before it answers
    code, gone, cpu_s = zygote.EXIT.unpack(from_zygote(channel, b"exit")[0])
    if status is None:
        status = ended(code, cpu_s, timeout_s)
    for fd in buffers:
        os.close(fd)
    clean = wipe() and gone  # a process that outlived the kill costs the container
    oom_after = oom_kills()
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
        "oom_killed": oom_before is not None and oom_after is not None and oom_after > oom_before,
        "dirty": not clean,
    }


def main():
    """Answer each job with one line carrying the job's nonce: the engine takes no other line as an answer."""
    channel_to_zygote = zygote.start(UID)  # first of all: the zygote must never see a job
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
            answer = run(job, channel_to_zygote)
        except Exception as exc:  # the runner must outlive anything a job does
            answer = {"reply": None, "status": f"runner error: {exc!r}", "stdout": "", "stderr": ""}
        answer["nonce"] = nonce
        channel.write(json.dumps(answer, allow_nan=True) + "\n")
        channel.flush()


if __name__ == "__main__":
    main()
