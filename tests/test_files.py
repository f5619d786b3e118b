import threading
from pathlib import Path

import pytest

from pipeline.core.errors import UserError
from pipeline.core.files import LockedError, atomic_path, file_lock, writable_dir, write_json, write_text


def test_atomic_path_renames_on_success(tmp_path):
    target = tmp_path / "sub" / "model.safetensors"
    with atomic_path(target) as tmp:
        assert tmp.suffix == ".safetensors" and tmp != target
        tmp.write_bytes(b"complete")
    assert target.read_bytes() == b"complete"
    assert [p.name for p in target.parent.iterdir()] == ["model.safetensors"]


@pytest.mark.parametrize("stop", [RuntimeError, KeyboardInterrupt])  # Ctrl-C is no Exception
def test_atomic_path_keeps_old_file_and_no_temp_on_failure(tmp_path, stop):
    target = tmp_path / "metrics.json"
    write_text(target, "old")
    with pytest.raises(stop):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise stop("killed mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_a_write_that_fails_before_its_file_exists_raises_its_own_error(tmp_path):
    """A block that fails before it writes anything (no temporary file yet: a record that cannot be
    serialised, say) raises its own error, not the cleanup's FileNotFoundError, and leaves nothing."""
    with pytest.raises(ValueError, match="not serialisable"):
        with atomic_path(tmp_path / "metrics.json"):
            raise ValueError("not serialisable")
    assert list(tmp_path.iterdir()) == []


def test_an_output_directory_is_made_with_its_parents_and_its_write_probe_leaves_nothing(tmp_path):
    """writable_dir makes a directory whose parents do not exist yet, and its probe file is gone after:
    a DVC output directory holds what the stage wrote and nothing else."""
    made = writable_dir(tmp_path / "a" / "b" / "models", "output")
    assert made == tmp_path / "a" / "b" / "models" and made.is_dir() and list(made.iterdir()) == []


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_directory_that_exists_but_takes_no_file_is_refused_before_any_work():
    """writable_dir writes a probe file: an existing directory that takes none (here /proc, which takes
    no new file even from root, as a read-only mount would) fails before training, not hours into it."""
    with pytest.raises(UserError, match="cannot write the output directory /proc/self"):
        writable_dir("/proc/self", "output")


def test_json_is_written_with_sorted_keys_and_a_final_newline(tmp_path):
    """Records written twice from the same numbers are the same bytes (the published runs diff cleanly)."""
    write_json(tmp_path / "a.json", {"b": 1, "a": {"d": 2, "c": 3}})
    assert (tmp_path / "a.json").read_text() == '{\n  "a": {\n    "c": 3,\n    "d": 2\n  },\n  "b": 1\n}\n'


def test_a_lock_that_fails_for_another_reason_than_a_holder_is_not_called_in_use(tmp_path, monkeypatch):
    """file_lock: only EAGAIN/EACCES mean another process holds the lock; any other failure of flock
    (no locks on this filesystem, say) is raised as it is, not told as "in use by another process"."""
    import errno

    from pipeline.core import files

    def no_locks(f, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(files.fcntl, "flock", no_locks)
    with pytest.raises(OSError, match="No locks available") as raised:
        with files.file_lock(tmp_path / "x.lock", wait=False):
            pass
    assert not isinstance(raised.value, files.LockedError)


def test_a_waiting_lock_waits_for_its_holder_and_a_lock_that_does_not_wait_is_refused(tmp_path):
    """file_lock(wait=True) (the MLflow store's lock) blocks until the holder lets go, then holds the
    file itself; wait=False (a checkpoint's) is refused at once while another holds it."""
    lock, order, trying = tmp_path / "x.lock", [], threading.Event()

    def waiter():
        trying.set()
        with file_lock(lock, wait=True):
            order.append("waiter holds it")

    with file_lock(lock, wait=False):
        with pytest.raises(LockedError, match="in use by another process"):
            with file_lock(lock, wait=False):
                pass
        thread = threading.Thread(target=waiter)
        thread.start()
        assert trying.wait(10)
        thread.join(0.5)  # time for the waiter to reach its lock: one that does not wait is refused there at once
        order.append("holder lets go")
    thread.join(10)
    assert order == ["holder lets go", "waiter holds it"]


@pytest.mark.parametrize("code", ["EAGAIN", "EACCES"])
def test_a_lock_refused_for_its_holder_is_in_use_by_another_process(tmp_path, monkeypatch, code):
    """flock's EAGAIN (EWOULDBLOCK), and EACCES which some systems return instead, both mean another
    process holds the lock: one line naming the lock, not an OSError."""
    import errno

    from pipeline.core import files

    def held(f, operation):
        raise OSError(getattr(errno, code), "Resource temporarily unavailable")

    monkeypatch.setattr(files.fcntl, "flock", held)
    with pytest.raises(LockedError, match=r"the checkpoint is in use by another process \(lock .*x.lock\)"):
        with file_lock(tmp_path / "x.lock", wait=False, what="the checkpoint"):
            pass
