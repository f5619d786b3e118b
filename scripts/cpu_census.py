"""Where a command's CPU goes: every process it starts, grouped by what it is, and with `--per-test`
each pytest test's own CPU and its children's. What docs/performance.md's "What the suite's CPU is
spent on" was measured with:

    python3 scripts/cpu_census.py -- make test                    # processes by kind
    python3 scripts/cpu_census.py --per-test -- make test         # and the tests that cost most
    python3 scripts/cpu_census.py --processes 20 -- make smoke    # and the 20 costliest processes' command lines

The census makes itself the child subreaper of everything it starts (a daemon that detaches, such as
the warm server, stays its descendant), reads every descendant's CPU from /proc every `--every`
seconds, and groups them by their command line (the first one seen: a forked warm stage shows its
server's). A process that starts and ends between two readings is not seen: the census prints how
much of the tree's whole CPU (its reaped children's rusage) it saw. With `--per-test` each test's CPU
is its worker's own (`time.process_time`) and the children it reaped during the test
(`getrusage(RUSAGE_CHILDREN)`); a child reaped in a later test is counted there. Linux only.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

ROWS_ENV = "CAPSNET_CENSUS_ROWS"  # the folder each pytest process of a --per-test run writes its tests' rows to
WERE_ENV = "CAPSNET_CENSUS_WERE"  # PYTEST_PLUGINS and PYTHONPATH as they were before the census set them
PR_SET_CHILD_SUBREAPER = 36  # prctl(2)
ORPHANS_WAIT = 10.0  # seconds the census waits for what the command left running
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# (kind, pattern over the command line), first match wins; anything else goes by its program's name.
# Anchored on a program or module, not a word anywhere: the suite's paths hold "pytest-of-…", "dvc", …
KINDS = [
    ("capped fingerprint processes", r" -m pipeline\.training\.fingerprint "),
    ("warm servers and their forked stages", r" -m pipeline\.warm "),
    ("inductor's C++ compiles", r"^\S*\b(cc1plus|g\+\+|c\+\+|gcc|cc|as|ld|collect2) |torch\._inductor\.compile_worker"),
    ("DVC", r"^\S*bin/dvc |^\S*python\S* \S*bin/dvc | -m dvc "),
    ("MLflow servers", r"bin/mlflow server|gunicorn|uvicorn|huey_consumer"),
    ("PostgreSQL", r"^\S*/(postgres|initdb|pg_ctl) "),
    ("capsnet clients and cold stages", r"^\S*bin/capsnet |^\S*python\S* \S*bin/capsnet | -m pipeline\.cli "),
    ("pytest and its workers", r" -m pytest |^\S*bin/pytest |exec\(eval\(sys\.stdin\.readline"),
]


def subreaper() -> None:
    """Make this process the reaper of its descendants' orphans (Linux 3.4+); elsewhere nothing."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def read_proc(pid: str) -> tuple[int, int, float, str] | None:
    """(parent pid, start tick, CPU seconds, command line) of ``pid``; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
    return int(fields[1]), int(fields[19]), (int(fields[11]) + int(fields[12])) / TICK, cmdline[:400]


class Sampler:
    """Every descendant of ``root`` seen in /proc, by (pid, start tick): its command line (the first
    non-empty one) and the most CPU it was seen with."""

    def __init__(self, root: int, every: float):
        self.root, self.every, self.seen = root, every, {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def processes(self) -> dict[str, tuple[int, int, float, str]]:
        """Every process in /proc now, by pid: `read_proc`'s answer."""
        return {pid: info for pid in os.listdir("/proc") if pid.isdigit() and (info := read_proc(pid))}

    def sample(self) -> None:
        procs = self.processes()
        parent = {int(pid): info[0] for pid, info in procs.items()}
        for pid, (_, start, cpu, cmdline) in procs.items():
            up, hops = int(pid), 0
            while up not in (self.root, 0, 1) and hops < 64:
                up, hops = parent.get(up, 0), hops + 1
            if up != self.root or int(pid) == self.root:
                continue
            old = self.seen.get((pid, start), {"cmdline": "", "cpu": 0.0})
            self.seen[(pid, start)] = {"cmdline": old["cmdline"] or cmdline, "cpu": max(old["cpu"], cpu)}

    def run(self) -> None:
        while not self.done.is_set():
            self.sample()
            self.done.wait(self.every)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def kind(cmdline: str) -> str:
    """What a process is, by its command line (`KINDS`, else its program's name)."""
    for name, pattern in KINDS:
        if re.search(pattern, cmdline + " "):
            return name
    words = cmdline.split()
    program = Path(words[0]).name if words else "(no command line)"
    if re.fullmatch(r"python[\d.]*|bash|sh", program) and len(words) > 1:
        if words[1].startswith("-c"):
            return f"{program} -c"
        program = Path(words[2] if words[1] == "-m" and len(words) > 2 else words[1]).name  # a script's name
    return program


def by_kind(seen: dict) -> list[tuple[str, float, int]]:
    """(kind, CPU seconds, processes) per kind, most CPU first."""
    totals = defaultdict(lambda: [0.0, 0])
    for proc in seen.values():
        total = totals[kind(proc["cmdline"])]
        total[0] += proc["cpu"]
        total[1] += 1
    return sorted(((k, cpu, n) for k, (cpu, n) in totals.items()), key=lambda row: -row[1])


def rows_of_tests(folder: Path) -> list[dict]:
    """Every test's row that the run's pytest processes wrote (`pytest_sessionfinish`), most CPU first."""
    rows = [row for path in sorted(folder.glob("*.json")) for row in json.loads(path.read_text())]
    return sorted(rows, key=lambda r: -(r["self"] + r["children"]))


def census(command: list[str], every: float, per_test: bool, top: int, processes: int = 0) -> int:
    """Run ``command`` under the census and print where its CPU went; its exit status."""
    with tempfile.TemporaryDirectory(prefix="census-") as rows:
        return census_into(Path(rows), command, every, per_test, top, processes)


def census_into(rows: Path, command: list[str], every: float, per_test: bool, top: int, processes: int) -> int:
    subreaper()
    env = dict(os.environ)
    if per_test:  # this file as a pytest plugin in the command's pytest and its xdist workers
        here = str(Path(__file__).resolve().parent)
        env |= {ROWS_ENV: str(rows), WERE_ENV: json.dumps({k: env.get(k) for k in ("PYTEST_PLUGINS", "PYTHONPATH")}),
                "PYTEST_PLUGINS": ",".join(filter(None, [env.get("PYTEST_PLUGINS"), "cpu_census"])),
                "PYTHONPATH": os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))}
    cores = os.cpu_count() or 1  # the machine's: /proc/stat's idle time is the whole machine's
    idle0, wall0 = idle_seconds(), time.perf_counter()
    process = subprocess.Popen(command, env=env)
    with Sampler(os.getpid(), every) as sampler:
        try:
            status = process.wait()
        except KeyboardInterrupt:
            process.wait()
            raise
        left = reap_orphans(ORPHANS_WAIT)
    if left:
        print(f"census: {left} process(es) the command left still run after {ORPHANS_WAIT} s; not waited for",
              file=sys.stderr)
    wall, idle = time.perf_counter() - wall0, idle_seconds() - idle0
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    whole, seen = reaped.ru_utime + reaped.ru_stime, sum(p["cpu"] for p in sampler.seen.values())
    print(f"\ncensus: {' '.join(command)} exited {status} after {wall:.0f} s on {cores} cores "
          f"({idle_percent(idle, wall, cores):.0f} % of them idle, the whole machine's)")
    print(f"census: {whole:.1f} s of CPU in its processes; {seen:.1f} s of it seen, in {len(sampler.seen)} "
          f"processes (one that lived under {every} s may be missed)")
    print(f"{'CPU s':>8} {'procs':>6}  kind")
    for name, cpu, n in by_kind(sampler.seen):
        print(f"{cpu:8.1f} {n:6d}  {name}")
    if processes:
        print(f"\ncensus: the {processes} processes that cost most")
        for proc in sorted(sampler.seen.values(), key=lambda p: -p["cpu"])[:processes]:
            print(f"{proc['cpu']:8.1f}  {proc['cmdline'][:200]}")
    if per_test:
        tests = rows_of_tests(rows)
        print(f"\ncensus: {len(tests)} tests, {sum(r['self'] for r in tests):.1f} s of CPU in their processes and "
              f"{sum(r['children'] for r in tests):.1f} s in the children they reaped; the {top} that cost most:")
        print(f"{'own s':>7} {'kids s':>7} {'wall s':>7}  test")
        for row in tests[:top]:
            print(f"{row['self']:7.1f} {row['children']:7.1f} {row['wall']:7.1f}  {row['id']}")
    return status


def reap_orphans(seconds: float) -> int:
    """Reap the processes the command left (orphans are this subreaper's), their CPU counted in its
    rusage, waiting at most ``seconds``; how many still run then."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0
        if pid == 0:
            if time.monotonic() > deadline:
                return sum(1 for p in os.listdir("/proc") if p.isdigit() and (i := read_proc(p)) and i[0] == os.getpid())
            time.sleep(0.05)


def idle_seconds(stat: str | None = None) -> float:
    """The machine's idle CPU seconds since boot, all cores together, from ``stat`` (the text of
    /proc/stat, read when None)."""
    fields = (Path("/proc/stat").read_text() if stat is None else stat).split("\n", 1)[0].split()
    return (int(fields[4]) + int(fields[5])) / TICK  # idle and iowait


def idle_percent(idle: float, wall: float, cores: int) -> float:
    """The share of ``cores`` cores' time over ``wall`` seconds that ``idle`` seconds of idle time are."""
    return 100 * idle / max(wall * cores, 1e-9)


# ---- the pytest plugin of --per-test (PYTEST_PLUGINS=cpu_census, which only the census sets) --------

if "pytest" in sys.modules:  # imported by pytest as its plugin, not run as the census
    import pytest

    _ROWS: list[dict] = []

    def pytest_configure(config):
        """Where no xdist workers are still to start (a worker, or a run without -n), give the tests the
        environment they would have had: a test that starts pytest itself with a PYTHONPATH of its own
        (scripts/mutate.py's copies) must not be asked to load this plugin from where it cannot."""
        if os.environ.get(WERE_ENV) and (hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)):
            for name, value in json.loads(os.environ.pop(WERE_ENV)).items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        own, kids, wall = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        yield
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        _ROWS.append({"id": item.nodeid, "self": time.process_time() - own, "wall": time.perf_counter() - wall,
                      "children": (after.ru_utime + after.ru_stime) - (kids.ru_utime + kids.ru_stime)})

    def pytest_sessionfinish(session, exitstatus):
        if os.environ.get(ROWS_ENV):
            name = os.environ.get("PYTEST_XDIST_WORKER", "main")
            (Path(os.environ[ROWS_ENV]) / f"{name}-{os.getpid()}.json").write_text(json.dumps(_ROWS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s [--per-test] [--every S] [--top N] [--processes N] -- COMMAND ...")
    parser.add_argument("--per-test", action="store_true", help="also each pytest test's CPU (COMMAND runs pytest)")
    parser.add_argument("--every", type=float, default=0.25, help="seconds between readings of /proc (default 0.25)")
    parser.add_argument("--top", type=int, default=15, help="tests listed with --per-test (default 15)")
    parser.add_argument("--processes", type=int, default=0, metavar="N",
                        help="also the N processes that cost most, with their command lines")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command: put it after --, e.g. python3 scripts/cpu_census.py -- make test")
    if not Path("/proc/self/stat").exists():
        parser.error("the census reads /proc: it runs on Linux only")
    sys.exit(census(command, args.every, args.per_test, args.top, args.processes))


if __name__ == "__main__":
    main()
