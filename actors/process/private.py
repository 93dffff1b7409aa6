"""The service's private runtime directory: every socket, configuration and state file that
vaultvec, and the Ray, Serve and HAProxy processes it starts, keep on the machine lives under
one directory that only the service's user may enter (docs/security.md, On the machine).

A directory in a shared temp dir is trusted only when this process made it or finds it owned by
its own user, mode 0700, not a symbolic link, in a parent others cannot rename it out of (not
writable by others, or sticky like /tmp). Someone else's directory of the default name (made
before the service started, to catch its files) is never used: `vaultvec serve` then makes a
fresh private one and hands its path to every process it starts in :data:`ENV`.
"""

from __future__ import annotations

import os
import stat
import tempfile

ENV = "VAULTVEC_RUNTIME_DIR"


def default_path() -> str:
    return os.path.join(tempfile.gettempdir(), f"vaultvec-{os.getuid()}")


def is_private(path: str) -> bool:
    """``path`` is a directory of this user's that no one else may enter or replace."""
    try:
        st = os.lstat(path)
        parent = os.stat(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    ours = stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077
    # Others who may write the parent could rename this directory away and put theirs in its
    # place, unless the parent is sticky (then only its owner, root or the parent's owner can).
    parent_safe = parent.st_uid in (0, os.getuid()) and not (
        parent.st_mode & 0o022 and not parent.st_mode & stat.S_ISVTX
    )
    return ours and parent_safe


def private_directory(path: str | None = None) -> str | None:
    """``path`` (default: the runtime directory), made if missing, when only this user may enter
    it; else None (someone else's directory in a shared temp dir: never used)."""
    base = path or runtime_path()
    try:
        os.makedirs(base, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return base if is_private(base) else None


def runtime_path() -> str:
    """The runtime directory's path: :data:`ENV` if set, else ``vaultvec-<uid>`` in the temp
    dir."""
    return os.environ.get(ENV) or default_path()


def runtime_directory() -> str | None:
    """The runtime directory if it is private (made if missing), else None."""
    return private_directory(runtime_path())


def subdirectory(name: str) -> str | None:
    """``name`` inside the runtime directory, made private if missing; None without one."""
    base = runtime_directory()
    return None if base is None else private_directory(os.path.join(base, name))


def claim() -> str:
    """For a process that starts the service (`vaultvec serve`, before anything else): the
    runtime directory, private. If the configured or default one is not (someone else made it,
    or it is open to others), a fresh one is made with :func:`tempfile.mkdtemp` (0700, a name
    no one could have guessed) and exported in :data:`ENV`, so every process started from here
    on uses it."""
    found = runtime_directory()
    if found is not None:
        os.environ[ENV] = found
        return found
    made = tempfile.mkdtemp(prefix=f"vaultvec-{os.getuid()}-")
    if not is_private(made):  # the temp dir itself lets others replace what is made in it
        raise OSError(f"no private runtime directory can be made in {os.path.dirname(made)}")
    os.environ[ENV] = made
    return made
