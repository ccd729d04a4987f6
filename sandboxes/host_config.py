"""What of the host's configuration under /usr both sandboxes hide: /usr comes in whole for its programs and
libraries, but a host keeps local configuration there too (pip.conf, npmrc: where tokens live)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from sandboxes.private_dirs import private_folder

# /usr comes in whole for its programs and libraries, but a host keeps its local configuration under it too
# (pip.conf, npmrc: where tokens live); both sandboxes put an empty read-only folder over these.
# npm reads `{prefix}/etc/npmrc`, so a node installed with prefix /usr keeps its registry token in /usr/etc.
HOST_CONFIG_UNDER_USR = ("/usr/local/etc", "/usr/etc")
# Credentials that tools keep at their installation's top rather than under an etc: pip reads `{sys.prefix}/pip.conf`
# (a Python installed with prefix /usr/local or /usr), the official Rust images keep CARGO_HOME at /usr/local/cargo,
# gcloud keeps installation-wide properties (proxy passwords) beside its code. Both sandboxes put an empty
# read-only file over each (over its target when it is a link to a file under /usr).
HOST_FILES_UNDER_USR = (
    "/usr/pip.conf",
    "/usr/local/pip.conf",
    "/usr/local/cargo/credentials",
    "/usr/local/cargo/credentials.toml",
    "/usr/lib/google-cloud-sdk/properties",
)


def hidden_host_config() -> list[str]:
    """The folders of HOST_CONFIG_UNDER_USR this host has, a link by the folder it leads to: a mount needs a real
    mount point, so a link (`/usr/etc -> /etc`) made bubblewrap refuse every job, and in Docker the empty folder
    landed on the container's own /etc. A link that leads out of /usr shows nothing of the host in the jail."""
    found: list[Path] = []
    for path in HOST_CONFIG_UNDER_USR:
        real = Path(os.path.realpath(path))
        if real.is_dir() and real.is_relative_to("/usr") and real not in found:
            found.append(real)
    # One inside another is hidden with it; a mount point inside the empty read-only folder could not be made.
    return [str(f) for f in found if not any(f != other and f.is_relative_to(other) for other in found)]


def hidden_host_files() -> list[str]:
    """The files of HOST_FILES_UNDER_USR this host has, a link by the file it leads to: a mount over a link lands on
    its target, which must therefore be in the jail (under /usr, and not in a folder already hidden). A link that
    leads out of /usr dangles in the jail and reads nothing anyway."""
    found: list[str] = []
    hidden = hidden_host_config()  # resolved, as `real` is: a file in a linked hidden folder is hidden already
    for path in HOST_FILES_UNDER_USR:
        real = Path(os.path.realpath(path))
        inside = real.is_relative_to("/usr") and not any(real.is_relative_to(h) for h in hidden)
        if real.is_file() and inside and str(real) not in found:
            found.append(str(real))
    return found


def empty_file() -> str:
    """A read-only empty file to bind over a hidden one. Not /dev/null: the jail mounts nodev, where opening a
    device node fails, so a candidate's `open()` there raised instead of reading nothing.

    One per user, at a fixed name in the user's private folder (sandboxes/private_dirs.py: root's under /run, where
    no user can make the name first and so refuse every root job): every engine of the user shares it, and an
    engine that ends without its exit handlers (kill -9, or an interrupted run's os._exit) leaves nothing behind (a
    file per run piled up in /tmp). Made again when gone or changed (a week-long run outlives a /tmp cleaner's age
    limit; a missing bind source would stop every candidate); written under a temporary name and renamed into
    place, so that engines starting together never see a half-made one."""
    uid = os.geteuid()
    folder = private_folder("vpo-evolve-empty", "sandbox")
    path = folder / "empty"
    try:
        found = os.lstat(path)
        if stat.S_ISREG(found.st_mode) and found.st_size == 0 and found.st_uid == uid:
            return str(path)
    except FileNotFoundError:
        pass
    handle, staging = tempfile.mkstemp(dir=folder, prefix="empty-")
    os.close(handle)
    os.chmod(staging, 0o444)
    os.replace(staging, path)
    return str(path)
