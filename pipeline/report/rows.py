"""The report's rows: which runs pool into one row, in which order, and which rows compare.

A row is one variant's runs under one protocol and one training code (`group`: the fingerprint the
runs recorded, else their commit; pipeline.report.runs.Run.commit_key). Rows of two variants, or two
fingerprints of one code, compare only through a commit whose code computes both (`bridge`,
`same_code`, `shared_commit`); the headline protocol is the one with the most runs (`protocols`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from pipeline.core import lineage
from pipeline.core.protocol import NOT_RECORDED
from pipeline.report.runs import Run, short


def group(runs: list[Run]) -> dict[tuple, list[Run]]:
    """Runs by (variant, protocol, commit), in the order first seen: the report's unit of a row."""
    out: dict[tuple, list[Run]] = {}
    for r in runs:
        out.setdefault((r.variant, r.protocol_key, r.commit_key), []).append(r)
    return out


def ordered_rows(runs: list[Run]) -> list[tuple[tuple, list[Run]]]:
    """`group`'s rows, the headline protocol's first (`protocols`), each protocol's as first seen."""
    order = {key: k for k, key in enumerate(protocols(runs))}
    return sorted(group(runs).items(), key=lambda item: order[item[0][1]])


def protocols(runs: list[Run]) -> list[tuple]:
    """The protocol keys present, the headline (the claims', the README's) first: the one with the
    most runs, so a protocol a GPU window has only begun never displaces one whose seeds are all
    there; of as many, the longest training (the paper protocol before a shorter one); then the one
    with more current records (a seed's last in ``runs``: `publish.with_earlier` puts the records a
    later run displaced before it), i.e. the newer; then as first seen."""
    counts = Counter(r.protocol_key for r in runs)
    current = Counter(r.protocol_key for r in {(r.variant, r.seed): r for r in runs}.values())
    return sorted(counts, key=lambda k: (-counts[k], -k[1], -current[k]))  # stable: as first seen


def with_several_rows(runs: list[Run]) -> set[str]:
    """The variants ``runs`` hold under more than one (protocol, training code): several report rows,
    which labels (`run_label`) and file names tell apart."""
    rows = group(runs)
    return {v for v, _, _ in rows if sum(key[0] == v for key in rows) > 1}


def run_label(r: Run, ambiguous: set[str]) -> str:
    """A run's variant, with protocol and commit where the report holds several of them for it."""
    return f"{r.variant} ({r.cfg['epochs']} ep, {r.commit_key})" if r.variant in ambiguous else r.variant


def row_commit(runs: list[Run]) -> str:
    """A row's origin as its tables show it: the commit of its runs, or, for runs grouped by their
    training fingerprint, ``fp <8 hex>: <the commits they came from>``, then ``; computed by <commits>``
    where fingerprint tables of other commits compute the same (`bridge`)."""
    if runs[0].fingerprint == NOT_RECORDED:
        return runs[0].commit
    own = list(dict.fromkeys(short(r.commit) for r in runs))
    tables = [c for c in commits_of(runs) if c not in own]
    return f"{runs[0].commit_key}: {', '.join(own)}" + (f"; computed by {', '.join(tables)}" if tables else "")


def row_key(commit: str) -> str:
    """The `Run.commit_key` of a row's runs, from the row's `row_commit`."""
    return commit.split(":")[0] if commit.startswith("fp ") else short(commit)


def commits_of(runs: list[Run]) -> list[str]:
    """The commits (7 characters) whose code computes a row's training: those its runs came from,
    then those whose fingerprint table computes their fingerprint (`bridge`); NOT_RECORDED left out."""
    own = [short(r.commit) for r in runs if r.commit != NOT_RECORDED]
    return list(dict.fromkeys(own + [c for r in runs for c in r.computed_by]))


def bridge(runs: list[Run], tables: list[dict]) -> list[Run]:
    """Each run with the commits of the ``tables`` that compute its training (`Run.computed_by`): its
    fingerprint in the table's environment (the one it recorded, or its own commit's there:
    pipeline.core.lineage) is the table's; so rows of two variants trained at two commits compare
    where one commit's code computes both. A run without a fingerprint is left as it is (no table
    computes it: `lineage.fingerprint_in` is None)."""
    out = []
    for r in runs:
        by = tuple(dict.fromkeys(short(t["commit"]) for t in tables if short(t["commit"]) != short(r.commit)
                                 and t["fingerprints"].get(r.variant) is not None
                                 and lineage.fingerprint_in(r.config, r.variant, t.get("environment"), tables)
                                 == t["fingerprints"][r.variant]))
        out.append(dataclasses.replace(r, computed_by=by) if by else r)
    return out


def same_code(runs: list[Run]) -> list[Run]:
    """``runs`` (bridged: `bridge`) with the rows of one variant and protocol whose training code is one
    joined: two rows of fingerprints recorded in two environments (a host's processor and C library
    decide them) that compute one commit's code (`shared_commit`) are that commit's training, so one row,
    under the fingerprint of its last run (`Run.same_code_as`); a seed in both is then one seed trained
    again (`publish.one_per_seed`), not two. Rows without a fingerprint stay as they are."""
    rows = group(runs)
    target: dict[tuple, tuple] = {}  # row key: the key of the row it joins
    for key, mine in rows.items():
        if mine[0].fingerprint == NOT_RECORDED:
            continue
        for other in dict.fromkeys(target.values()):  # the rows joined so far
            if other[:2] == key[:2] and shared_commit(mine, rows[other]) is not None:
                target[key] = other
                break
        else:
            target[key] = key
    last = {}  # joined row: its last run's fingerprint
    for r in runs:
        if (r.variant, r.protocol_key, r.commit_key) in target:
            last[target[(r.variant, r.protocol_key, r.commit_key)]] = r.fingerprint
    joins = Counter(target.values())  # a joined row: how many rows it holds
    out = []
    for r in runs:
        joined = target.get((r.variant, r.protocol_key, r.commit_key))
        several = joined is not None and joins[joined] > 1
        out.append(dataclasses.replace(r, same_code_as=last[joined]) if several and last[joined] != r.fingerprint else r)
    return out


def shared_commit(a: list[Run], b: list[Run]) -> str | None:
    """A commit whose code computes both rows' training (`commits_of`: one their runs came from, or
    one whose fingerprint table computes their fingerprints), or None. A row holds one variant's runs
    of one training fingerprint (or one commit where none was recorded), and two variants'
    fingerprints never agree, so rows of two variants compare through such a commit: every run of
    either row computes what that commit's code computes. Not transitive: rows A and C that each
    share a commit with B need not share one."""
    theirs = set(commits_of(b))
    return next((c for c in commits_of(a) if c in theirs), None)


def cohorts(commits: dict[str, list[str]]) -> list[tuple[str, list[str]]]:
    """Rows, as {label (`row_commit`): the commits that compute it (`commits_of`)}, in groups that
    share one commit, the commit most of them share first: [(commit, labels)]. A row sharing no
    commit with another is a group of its own."""
    left, out = list(commits), []
    while left:
        counts: dict[str, int] = {}
        for label in left:
            for c in commits[label]:
                counts[c] = counts.get(c, 0) + 1
        if not counts:
            out += [(label, [label]) for label in left]
            break
        commit = max(counts, key=counts.get)  # the first of the most shared
        group = [label for label in left if commit in commits[label]]
        out.append((commit, group))
        left = [label for label in left if label not in group]
    return out
