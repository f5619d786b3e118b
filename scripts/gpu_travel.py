"""What every call of a GPU window sends to the device machine, against the device tool's limit: the
files git tracks (as the working tree has them), the untracked ones it does not ignore, and the
carried paths (`.gpu`: MNIST's files). The device tool refuses a call whose tree is over 64 MiB, so
a window would open on a repository that has grown past it (each window's runs are committed to
reports/runs) and spend its minutes on mending it.

    python3 scripts/gpu_travel.py [--carry .gpu ...] [--limit-mib 64] [--margin-mib 8]
    python3 scripts/gpu_travel.py --list [--carry .gpu ...]   (those files, NUL-separated: scripts/gpu_rehearse.sh sends them)

Prints `travels: X MiB of 64 MiB (tracked …, untracked …, carried .gpu …)`; within --margin-mib of
the limit (about what a window's runs add) a second line says so; over the limit it exits 1 with one
line naming the largest folders (2 outside a git checkout). scripts/gpu_fetch_mnist.sh runs it before a
window, scripts/gpu_import.sh after one. Needs only git and Python.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

MIB = 1 << 20
DEPTH = 3  # folders are summed this many levels down (reports/runs/earlier) to name the largest


def travelling(root: Path, carry: list[str]) -> dict[str, dict[str, int]]:
    """{"tracked" | "untracked" | "carried <path>": {relative file path: bytes}} of what travels."""
    def listed(*args: str) -> list[str]:
        out = subprocess.run(["git", "ls-files", "-z", *args], cwd=root, capture_output=True, check=True).stdout
        return [p for p in out.decode().split("\0") if p]

    def sizes(paths) -> dict[str, int]:
        return {p: (root / p).stat().st_size for p in paths if (root / p).is_file() and not (root / p).is_symlink()}

    groups = {"tracked": sizes(listed("--cached")), "untracked": sizes(listed("--others", "--exclude-standard"))}
    for path in carry:
        found = [str(Path(d, f).relative_to(root)) for d, _, files in os.walk(root / path) for f in files] \
            if (root / path).is_dir() else [path]
        groups[f"carried {path}"] = sizes(found)
    return groups


def largest(files: dict[str, int], count: int = 5) -> list[tuple[str, int]]:
    """The ``count`` largest folders, ``DEPTH`` levels down at most, by the bytes of their files."""
    folders: dict[str, int] = {}
    for path, size in files.items():
        parts = Path(path).parts[:-1][:DEPTH]
        folder = "/".join(parts) if parts else "."
        folders[folder] = folders.get(folder, 0) + size
    return sorted(folders.items(), key=lambda kv: -kv[1])[:count]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--carry", action="append", help="a carried path (repeatable; default .gpu)")
    parser.add_argument("--limit-mib", type=float, default=64.0, help="the device tool's limit")
    parser.add_argument("--margin-mib", type=float, default=8.0, help="warn within this much of the limit")
    parser.add_argument("--list", action="store_true", help="print the files that travel, NUL-separated, and nothing else")
    args = parser.parse_args(argv)
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if top.returncode != 0:
        print(f"{Path.cwd()} is not a git checkout: what a GPU call sends is measured on the checkout it sends",
              file=sys.stderr)
        return 2
    root = Path(top.stdout.strip())
    groups = travelling(root, args.carry or [".gpu"])
    every = {path: size for files in groups.values() for path, size in files.items()}
    if args.list:
        sys.stdout.write("".join(f"{path}\0" for path in every))
        return 0
    total = sum(every.values()) / MIB
    parts = ", ".join(f"{name} {sum(files.values()) / MIB:.1f}" for name, files in groups.items())
    print(f"travels: {total:.1f} MiB of {args.limit_mib:g} MiB ({parts})")
    biggest = ", ".join(f"{folder} {size / MIB:.1f}" for folder, size in largest(every))
    if total > args.limit_mib:
        print(f"what a GPU call sends is {total:.1f} MiB, over the device tool's {args.limit_mib:g} MiB, so it would "
              f"refuse the window's calls: publish smaller run records or carry less (largest, MiB: {biggest})",
              file=sys.stderr)
        return 1
    if total > args.limit_mib - args.margin_mib:
        print(f"within {args.margin_mib:g} MiB of the limit, about what a window's runs add: make room before the "
              f"next window (largest, MiB: {biggest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
