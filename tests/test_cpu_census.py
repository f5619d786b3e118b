"""scripts/cpu_census.py, what docs/performance.md's account of the suite's CPU comes from: every
process a command starts is counted under its kind, a detached one too, and with --per-test each
test's CPU is split into its own and its children's. Each figure here is CPU time a process burns on
purpose, so a loaded machine slows the test but does not change what it reads."""

import re
import subprocess
import sys
import textwrap

from conftest import REPO

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
    done, _ = census(tmp_path, "--per-test", "--", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                     "-n", "2", str(tmp_path / "test_burn.py"))  # in xdist's workers, as `make test` runs
    assert done.returncode == 0, done.stdout + done.stderr
    tests = {row[4]: (float(row[1]), float(row[2])) for row in
             re.finditer(r"^ *(\d+\.\d) +(\d+\.\d) +(\d+\.\d)  \S*::(\w+)$", done.stdout, re.M)}
    assert set(tests) == {"test_starts_a_child", "test_burns_its_own", "test_sees_the_environment_it_would_have_had"}, \
        done.stdout
    own, children = tests["test_starts_a_child"]
    assert children >= 0.7 and own < 0.3, done.stdout
    own, children = tests["test_burns_its_own"]
    assert own >= 0.35 and children < 0.1, done.stdout
    assert "census: 3 tests," in done.stdout
