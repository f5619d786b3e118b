"""Atomic file writes and file locks: a stage either leaves a complete file or none (never a
half-written one), and two processes never work on the same file at once."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.core.errors import UserError


class LockedError(UserError):
    """Another process holds the lock; the message names the file."""


def writable_dir(path: str | Path, what: str) -> Path:
    """Create ``path`` if needed and check a file can be written there, before any work starts."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{uuid.uuid4().hex}"
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise UserError(f"cannot write the {what} directory {path}: {err.strerror}; "
                        "fix its permissions or pass another path") from err
    return path


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` (same suffix; unique per call, so concurrent writers
    never share it) to write; rename it onto ``path`` only when the block succeeds, delete it
    when the block fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp{path.suffix}")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, obj: dict) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


@contextmanager
def file_lock(path: str | Path, *, wait: bool, what: str = "") -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (created if missing) for the block. ``wait=False``
    raises :class:`LockedError` at once when another process holds it; the OS drops the lock
    when its holder dies, so a killed process never leaves a stale lock behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise LockedError(f"{what or path} is in use by another process (lock {path}); "
                              "wait for it to finish or stop it") from err
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
