"""A run's training fingerprint in another environment than the one it recorded it in.

A fingerprint compares only within its environment (torch's version, the capped CPU kernels:
pipeline.training.fingerprint). When the environment changes (a new torch, a new cap), runs trained
before would stop comparing with runs trained after, though their training code may be the same.
Fingerprint tables carry them over: a table of the run's own commit in its own environment that holds
the fingerprint it recorded shows that the run trained what that commit's code computes; a table of
the same commit in another environment then says what that code computes there. One definition for
the report (pipeline.report.rows.bridge) and the GPU queue (scripts/gpu_queue.py); torch-free.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path


def load_tables(folder: Path | None) -> list[dict]:
    """The fingerprint tables (`capsnet fingerprint`'s JSON files) in ``folder``, by file name; none if it
    is None or absent."""
    if folder is None or not folder.is_dir():
        return []
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]


def recorded(config: Mapping) -> tuple[str | None, str | None, str | None]:
    """(fingerprint, its environment, commit) as a run's config.json recorded them (None: not recorded)."""
    env = config.get("environment", {})
    return config.get("training_fingerprint"), env.get("fingerprint_environment"), env.get("git_commit")


def fingerprint_in(config: Mapping, variant: str, environment: str, tables: list[dict]) -> str | None:
    """The fingerprint of the training code of a run (its config.json ``config``) in ``environment``:
    the one it recorded where it recorded it there; else, where one of ``tables`` of its own commit in
    its own environment holds the fingerprint it recorded, what a table of that commit in
    ``environment`` holds for ``variant``; else None (not known there)."""
    fingerprint, own_env, commit = recorded(config)
    if fingerprint is None:
        return None
    if own_env == environment:
        return fingerprint
    if not vouched(config, variant, tables):
        return None  # its commit's code computed something else where it trained: the commit does not say
    there = [t["fingerprints"].get(variant) for t in tables if t.get("commit") == commit and t.get("environment") == environment]
    return there[0] if there else None


def vouched(config: Mapping, variant: str, tables: list[dict]) -> bool:
    """Whether one of ``tables`` of a run's own commit in its own environment holds the fingerprint it
    recorded: the run trained what its commit's code computes, so a table of that commit in another
    environment says what the run's code computes there."""
    fingerprint, own_env, commit = recorded(config)
    return fingerprint is not None and commit is not None and any(
        t.get("commit") == commit and t.get("environment") == own_env and t["fingerprints"].get(variant) == fingerprint
        for t in tables)


def environment_tag(environment: str) -> str:
    """A short name for a fingerprint environment, for a table's file name: its SHA-256's first 8 hex digits."""
    return hashlib.sha256(environment.encode()).hexdigest()[:8]


def keep_tables(sources: list[Path], folder: Path) -> list[Path]:
    """Copy fingerprint tables into ``folder`` under their own names, except where a table of that name
    from another environment is there (one commit's table from two hosts): then beside it, the name
    ending in the environment's hash, never over it; where each went."""
    folder.mkdir(parents=True, exist_ok=True)
    kept = []
    for source in sources:
        dest, environment = folder / source.name, json.loads(source.read_text())["environment"]
        if dest.is_file() and json.loads(dest.read_text())["environment"] != environment:
            dest = dest.with_name(f"{source.stem}-{environment_tag(environment)}.json")
        shutil.copyfile(source, dest)
        kept.append(dest)
    return kept
