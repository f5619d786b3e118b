"""scripts/cpu_census.py, what docs/performance.md's account of the suite's CPU comes from: every
process a command starts is counted under its kind, a detached one too, and with --per-test each
test's CPU is split into its own and its children's. Each figure here is CPU time a process burns on
purpose, so a loaded machine slows the test but does not change what it reads."""

import re
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, script

CENSUS = script("cpu_census")

BURN = textwrap.dedent("""
    import os, subprocess, sys, time
    def burn(seconds):
        start = time.process_time()
        while time.process_time() - start < seconds:
            pass
    if sys.argv[1:] == ["child"]:
        burn(0.8)  # the costliest
    elif sys.argv[1:] == ["detach"]:  # a daemon: its parent exits at once, it runs on in a session of its own
        if os.fork() == 0:
            os.setsid()
            burn(0.5)
            os._exit(0)
    else:
        subprocess.run([sys.executable, "-m", "burner_child", "child"])
        subprocess.run([sys.executable, __file__, "detach"])
        burn(0.3)
        sys.exit(3)
""")


def census(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, float]]:
    """The census of ``args`` (its options, then the command), modules in ``tmp_path`` importable:
    its result and its table's CPU seconds by kind."""
    done = subprocess.run([sys.executable, "scripts/cpu_census.py", *args], cwd=REPO, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)})
    rows = re.finditer(r"^ *(\d+\.\d) +\d+  (.+)$", done.stdout, re.M)
    return done, {row[2]: float(row[1]) for row in rows}


def test_every_process_a_command_starts_is_counted_under_its_kind_a_detached_one_too(tmp_path):
    (tmp_path / "burner.py").write_text(BURN)
    (tmp_path / "burner_child.py").write_text(BURN)
    done, kinds = census(tmp_path, "--every", "0.05", "--processes", "1", "--", sys.executable,
                         str(tmp_path / "burner.py"))
    assert done.returncode == 3, done.stdout + done.stderr  # the command's own status
    whole = float(re.search(r"census: (\d+\.\d) s of CPU in its processes", done.stdout)[1])
    assert whole >= 1.5, done.stdout  # 0.8 + 0.5 + 0.3: the detached one reaped by the census too
    assert kinds.get("burner_child", 0) >= 0.7, done.stdout  # `python -m NAME`: the module's name
    assert kinds.get("burner.py", 0) >= 0.7, done.stdout  # the script and the daemon it left
    assert "cpu_census.py" not in kinds, done.stdout  # the census's own sampling is not the command's
    costliest = done.stdout.split("census: the 1 processes that cost most\n")[1].splitlines()
    assert len(costliest) == 1 and costliest[0].endswith(f"{sys.executable} -m burner_child child"), done.stdout


TESTS = textwrap.dedent("""
    import os, subprocess, sys, time
    def test_sees_the_environment_it_would_have_had():  # a pytest it starts must not look for the plugin
        assert "PYTEST_PLUGINS" not in os.environ and os.environ["PYTHONPATH"] == os.path.dirname(__file__)
    def test_starts_a_child():
        subprocess.run([sys.executable, "-m", "burner_child", "child"])
    def test_burns_its_own():
        start = time.process_time()
        while time.process_time() - start < 0.4:
            pass
""")


def test_per_test_splits_each_tests_cpu_into_its_own_and_its_childrens(tmp_path):
    (tmp_path / "burner_child.py").write_text(BURN)
    (tmp_path / "test_burn.py").write_text(TESTS)
    done, _ = census(tmp_path, "--per-test", "--top", "2", "--", sys.executable, "-m", "pytest", "-q", "-p",
                     "no:cacheprovider", "-n", "2", str(tmp_path / "test_burn.py"))  # in xdist's workers, as `make test` runs
    assert done.returncode == 0, done.stdout + done.stderr
    tests = {row[4]: (float(row[1]), float(row[2])) for row in
             re.finditer(r"^ *(\d+\.\d) +(\d+\.\d) +(\d+\.\d)  \S*::(\w+)$", done.stdout, re.M)}
    assert list(tests) == ["test_starts_a_child", "test_burns_its_own"], done.stdout  # --top 2, costliest first
    own, children = tests["test_starts_a_child"]
    assert children >= 0.7 and own < 0.3, done.stdout
    own, children = tests["test_burns_its_own"]
    assert own >= 0.35 and children < 0.1, done.stdout
    assert "census: 3 tests," in done.stdout


@pytest.mark.parametrize("cmdline, kind", [
    ("/w/.venv/bin/python -m pipeline.training.fingerprint --cap 1", "capped fingerprint processes"),
    ("/w/.venv/bin/python -P -m pipeline.warm serve /tmp/w.sock", "warm servers and their forked stages"),
    ("/usr/lib/gcc/x86_64-linux-gnu/12/cc1plus -quiet k.cpp", "inductor's C++ compiles"),
    ("/w/.venv/bin/python -m torch._inductor.compile_worker --pickler", "inductor's C++ compiles"),
    ("/w/.venv/bin/python /w/.venv/bin/dvc repro", "DVC"),
    ("/w/.venv/bin/python /tmp/pytest-of-u/pytest-3/test_dvc_stage0/run.py", "run.py"),  # "dvc" in a path only
    ("/w/.venv/bin/python /w/.venv/bin/mlflow server --port 5000", "MLflow servers"),
    ("/usr/lib/postgresql/15/bin/postgres -D /tmp/pg", "PostgreSQL"),
    ("/w/.venv/bin/capsnet train --variant capsnet_r3_recon", "capsnet clients and cold stages"),
    ("/w/.venv/bin/python -m pipeline.cli train", "capsnet clients and cold stages"),
    ("/w/.venv/bin/python -m pytest -q tests/test_dvc.py", "pytest and its workers"),
    ("/w/.venv/bin/python -c import sys;exec(eval(sys.stdin.readline()))", "pytest and its workers"),  # xdist's
    ("/w/.venv/bin/python -c print(1)", "python -c"),
    ("bash scripts/gpu_plan.sh", "gpu_plan.sh"),
    ("sleep 1", "sleep"),
    ("", "(no command line)"),
])
def test_a_process_is_counted_under_the_kind_its_program_or_module_names(cmdline, kind):
    assert CENSUS.kind(cmdline) == kind


class Proc(CENSUS.Sampler):
    """A sampler over a /proc of our making: ``table`` pid -> (parent pid, start tick, CPU s, command line)."""

    def __init__(self, table):
        super().__init__(root=10, every=1.0)
        self.table = table

    def processes(self):
        return dict(self.table)


def test_the_sampler_keeps_the_commands_descendants_with_their_first_command_line_and_most_cpu():
    sampler = Proc({"10": (1, 5, 9.0, "python3 scripts/cpu_census.py -- make test"),  # the census itself
                    "11": (10, 6, 1.0, "make test"), "12": (11, 7, 2.0, "python -m pytest"),
                    "20": (1, 8, 4.0, "sshd")})  # not the command's
    sampler.sample()
    sampler.table |= {"12": (11, 7, 3.5, "python -m pytest renamed"), "11": (10, 6, 1.0, "")}
    sampler.sample()
    assert sampler.seen == {("11", 6): {"cmdline": "make test", "cpu": 1.0},
                            ("12", 7): {"cmdline": "python -m pytest", "cpu": 3.5}}
    sampler.table["12"] = (11, 9, 0.5, "sleep 1")  # its pid taken by a new process: counted apart
    sampler.sample()
    assert sampler.seen[("12", 9)] == {"cmdline": "sleep 1", "cpu": 0.5} and len(sampler.seen) == 3
    assert CENSUS.by_kind(sampler.seen) == [("pytest and its workers", 3.5, 1), ("make", 1.0, 1), ("sleep", 0.5, 1)]
    sampler.table["13"] = (11, 10, 0.7, "sleep 2")
    sampler.sample()
    assert CENSUS.by_kind(sampler.seen)[1:] == [("sleep", 1.2, 2), ("make", 1.0, 1)]


def test_the_idle_share_is_idle_and_iowait_over_every_cores_time():
    stat = "cpu  500 0 300 4000 1000 0 0 0 0 0\ncpu0 250 0 150 2000 500 0 0 0 0 0\n"
    assert CENSUS.idle_seconds(stat) == 5000 / CENSUS.TICK
    assert CENSUS.idle_percent(30.0, wall=20.0, cores=2) == 75.0


def test_the_census_without_a_command_says_where_to_put_it(tmp_path):
    done, _ = census(tmp_path, "--every", "0.1")
    assert done.returncode == 2 and done.stderr.splitlines()[-1].endswith(
        "no command: put it after --, e.g. python3 scripts/cpu_census.py -- make test"), done.stderr
