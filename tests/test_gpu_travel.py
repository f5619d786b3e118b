"""What a GPU call carries and when: the MNIST copy, the size a call sends against the device tool's limit,
the window's seconds from LEFT and when it was read, and the next call's command for a tree that is HEAD."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO


def test_the_mnist_a_window_carries_is_copied_whole_or_not_at_all_saying_why(tmp_path):
    """scripts/gpu_fetch_mnist.sh: the mirror's four .gz files into .gpu/mnist (the carried folder), then
    what a call would send; a mirror missing any of them is one line naming it and the variable to set,
    and nothing copied."""
    (tmp_path / "scripts").mkdir()
    for name in ("gpu_fetch_mnist.sh", "gpu_travel.py"):
        shutil.copy(REPO / "scripts" / name, tmp_path / "scripts" / name)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text("/.gpu/\n")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    names = [f"{s}-{k}-idx{d}-ubyte.gz" for s in ("train", "t10k") for k, d in (("images", 3), ("labels", 1))]
    for name in names[:3]:
        (mirror / name).write_bytes(b"gz")

    def fetch():
        return subprocess.run(["bash", "scripts/gpu_fetch_mnist.sh"], cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, "CAPSNET_MNIST_MIRROR": str(mirror)})

    short = fetch()
    assert short.returncode == 1 and not (tmp_path / ".gpu").exists(), short.stdout + short.stderr
    assert short.stderr == f"{mirror} holds 3 of MNIST's four *-ubyte.gz files: set CAPSNET_MNIST_MIRROR to a folder that holds them all\n"
    (mirror / names[3]).write_bytes(b"gz")
    done = fetch()
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (tmp_path / ".gpu" / "mnist").iterdir()) == sorted(names)
    assert "MiB" in done.stdout  # gpu_travel.py's account of what a call sends


def test_what_a_gpu_call_sends_is_measured_against_the_device_tools_limit(tmp_path):
    """scripts/gpu_travel.py (gpu_fetch_mnist.sh before a window, gpu_import.sh after one) sums what
    the device tool sends: tracked and untracked-not-ignored files and the carried .gpu, not what git
    ignores otherwise; near the limit it warns, over it it fails naming the largest folders."""
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    def write(path, mib):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(b"x" * int(mib * (1 << 20)))

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("/.gpu/\n/models/\n")
    write("reports/runs/results/a/seed0/predictions.safetensors", 2)  # tracked
    write("reports/runs/earlier/r/results/a/seed0/predictions.safetensors", 1.5)
    git("add", ".")
    write("notes.txt", 0.5)  # untracked, not ignored: it travels
    write(".gpu/mnist/train-images-idx3-ubyte.gz", 1)  # ignored, carried
    write("models/a/seed0/checkpoint.pt", 50)  # ignored, not carried: stays here

    def travel(*args):
        return subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_travel.py"), *args], cwd=tmp_path,
                              capture_output=True, text=True)

    listed = travel("--list").stdout.split("\0")
    assert sorted(filter(None, listed)) == [".gitignore", ".gpu/mnist/train-images-idx3-ubyte.gz", "notes.txt",
                                            "reports/runs/earlier/r/results/a/seed0/predictions.safetensors",
                                            "reports/runs/results/a/seed0/predictions.safetensors"]  # what the rehearsal sends
    fits = travel("--limit-mib", "10", "--margin-mib", "1")
    assert fits.returncode == 0, fits.stderr
    assert fits.stdout.splitlines() == ["travels: 5.0 MiB of 10 MiB (tracked 3.5, untracked 0.5, carried .gpu 1.0)"]
    near = travel("--limit-mib", "5.5", "--margin-mib", "1")
    assert near.returncode == 0 and "within 1 MiB of the limit" in near.stdout
    over = travel("--limit-mib", "4")
    assert over.returncode == 1 and len(over.stderr.splitlines()) == 1
    assert "5.0 MiB, over the device tool's 4 MiB" in over.stderr
    assert "largest, MiB: reports/runs/results 2.0, reports/runs/earlier 1.5, .gpu/mnist 1.0, . 0.5)" in over.stderr
    bare = tmp_path / "bare"
    bare.mkdir()
    elsewhere = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_travel.py")], cwd=bare, capture_output=True,
                               text=True, env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp_path)})
    assert elsewhere.returncode == 2 and len(elsewhere.stderr.splitlines()) == 1 and "not a git checkout" in elsewhere.stderr


@pytest.mark.parametrize("warm", [False, True])
def test_the_window_is_what_left_loses_to_the_start_as_measured_and_allowed_after(tmp_path, warm):
    """scripts/gpu_plan.sh's window: LEFT (the device time read before the call) less the seconds since
    it was read (CAPSNET_GPU_LEFT_AT: the machine's start and the transfer in, measured) and an allowance
    for what follows the call; without a believable reading, the whole allowance (165 s cold, 75 s warm);
    under 60 s, give the machine back."""
    plan = (REPO / "scripts" / "gpu_plan.sh").read_text()
    fragment = plan[plan.index("TESTS=() WINDOW=()"):]
    fragment = fragment[:fragment.index("\nfi\n") + 4]
    if warm:
        (tmp_path / "logs").mkdir()
        (tmp_path / "logs" / "gpu_tests.done").touch()
    start = 1_795_764_155

    def window(**env):
        script = f"set -euo pipefail\nPLAN_START={start}\n" + fragment.replace(
            "SPENT=$(( $(date +%s) - PLAN_START ))", "SPENT=7") + 'echo "${WINDOW[@]}"'
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True,
                              env={k: v for k, v in os.environ.items() if not k.startswith("CAPSNET_GPU_")} | env)
        return done.stdout.strip()

    after, allowance = (30, 75) if warm else (60, 165)
    assert window() == ""  # no LEFT: the call knows its own deadline only
    assert window(CAPSNET_GPU_LEFT="900") == f"--window {900 - allowance - 7}"
    assert window(CAPSNET_GPU_LEFT="900", CAPSNET_GPU_LEFT_AT=str(start - 40)) == f"--window {900 - 40 - after - 7}"
    for unbelievable in (str(start + 5), str(start - 601), "07:22", ""):  # a clock ahead, a reading too old, not seconds
        assert window(CAPSNET_GPU_LEFT="900", CAPSNET_GPU_LEFT_AT=unbelievable) == f"--window {900 - allowance - 7}"
    assert "give the machine back" in window(CAPSNET_GPU_LEFT=str(allowance + 7 + 59))


def test_the_next_calls_command_has_its_numbers_and_a_tree_that_is_head(tmp_path):
    """scripts/gpu_command.sh LEFT prints the call's command with LEFT, now and HEAD typed in, and
    refuses in one line a tree that differs from HEAD (the runs record HEAD) or has no MNIST in .gpu."""
    import time

    tree = {"cwd": tmp_path, "capture_output": True, "text": True}
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "gpu_command.sh", tmp_path / "scripts")
    (tmp_path / ".gitignore").write_text("/.gpu/\n")
    subprocess.run(["git", "init", "-q"], check=True, **tree)
    subprocess.run(["git", "add", "."], check=True, **tree)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x"], check=True, **tree)
    head = subprocess.run(["git", "rev-parse", "HEAD"], check=True, **tree).stdout.strip()

    def command(*args):
        return subprocess.run(["bash", "scripts/gpu_command.sh", *args], **tree)

    assert command().returncode == 2 and command("15 min").returncode == 2
    missing = command("900")
    assert missing.returncode == 1 and "bash scripts/gpu_fetch_mnist.sh" in missing.stderr and not missing.stdout
    (tmp_path / ".gpu" / "mnist").mkdir(parents=True)
    (tmp_path / ".gpu" / "mnist" / "t10k-labels-idx1-ubyte.gz").write_bytes(b"")
    done = command("873")
    assert done.returncode == 0, done.stderr
    left, at, commit, *rest = done.stdout.split()
    assert (left, commit, rest) == ("CAPSNET_GPU_LEFT=873", f"CAPSNET_GIT_COMMIT={head}", ["bash", "scripts/gpu_plan.sh"])
    assert abs(int(at.removeprefix("CAPSNET_GPU_LEFT_AT=")) - time.time()) < 5
    for change in ("scripts/gpu_command.sh", "new.py"):  # a tracked file edited; an untracked one that would travel
        with open(tmp_path / change, "a") as f:
            f.write("\n")
        dirty = command("900")
        assert dirty.returncode == 1 and len(dirty.stderr.splitlines()) == 1 and "commit it first" in dirty.stderr
        assert change in dirty.stderr and not dirty.stdout
        subprocess.run(["git", "checkout", "-q", "--", "."], **tree)
        (tmp_path / "new.py").unlink(missing_ok=True)


def test_what_travels_leaves_out_deleted_files_and_links_and_counts_a_carried_file(tmp_path):
    """scripts/gpu_travel.py: a tracked file deleted from the working tree does not travel (the device tool
    sends the tree), nor does a link (it leaves links out); a carried path may be a single file."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text("/weights.pt\n")
    (tmp_path / "gone.txt").write_text("x")
    (tmp_path / "kept.txt").write_text("y" * 10)
    (tmp_path / "link.txt").symlink_to(tmp_path / "kept.txt")
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    (tmp_path / "gone.txt").unlink()
    (tmp_path / "weights.pt").write_bytes(b"w" * 5)
    listed = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_travel.py"), "--list", "--carry",
                             "weights.pt"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert sorted(filter(None, listed.split("\0"))) == [".gitignore", "kept.txt", "weights.pt"]
