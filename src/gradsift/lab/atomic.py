"""Atomic result files: a reader (or a Ctrl-C) never sees a half-written file."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_bytes", "atomic_write_json", "locked_folder", "read_json"]


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and a rename.

    ``os.replace`` is atomic on POSIX and Windows, so ``path`` holds either the old or
    the new content, whatever interrupts the write.

    The file gets the permissions a plain ``open(path, "w")`` would give: a new file
    ``0o666`` less the umask (the kernel applies it, so default ACLs apply too), a
    rewritten file keeps its mode. (``tempfile.mkstemp`` would make every file 0600.)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:  # closed however the rest ends
            with contextlib.suppress(FileNotFoundError):
                os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _create_temporary(path: Path) -> tuple[int, str]:
    """A new, exclusive file beside ``path``, created with mode 0o666 & ~umask."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary file name beside {path}")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def read_json(path: str | os.PathLike, default: Any = None) -> Any:
    """Read JSON from ``path``; ``default`` when the file does not exist."""
    path = Path(path)
    if not path.exists():
        return default
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"{path} is not valid JSON ({exc}); move it away to start afresh"
        ) from None


@contextlib.contextmanager
def locked_folder(folder: str | os.PathLike):
    """Hold an exclusive lock on ``folder`` (``flock``; created if missing) while the
    block runs: two processes that read, change and rewrite a file in it take turns.
    Where ``fcntl`` does not exist (Windows) the block runs unlocked."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (releases the lock)
