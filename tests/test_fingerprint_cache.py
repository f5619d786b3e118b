"""The disk cache of training fingerprints (pipeline.training.fingerprint_cache): computed once per code,
configuration and environment, kept whole or not at all, shared by processes."""

import json
import time
from pathlib import Path


from pipeline.training import fingerprint as fp
from pipeline.training.config import run_config

from conftest import disk_full, script


def answer(environment: str = "torch x, CPU AVX2 capped, MKL COMPATIBLE") -> dict:
    return {"fingerprints": [], "environment": environment}


def test_the_cache_computes_a_key_once_and_again_only_when_its_file_does_not_hold_an_answer(tmp_path, monkeypatch):
    from pipeline.training import fingerprint_cache as cache

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    computed = []

    def compute(environment="first"):
        computed.append(environment)
        return answer(environment)

    env = {"ATEN_CPU_CAPABILITY": "avx2"}
    assert cache.cached([], env, compute) == answer("first") and computed == ["first"]
    assert cache.cached([], env, lambda: compute("again")) == answer("first") and computed == ["first"]  # kept
    (entry,) = (tmp_path / "cache").glob("*.json")
    for broken in ("{", json.dumps({"fingerprints": ["a"], "environment": "x"})):  # half-written; another count
        entry.write_text(broken)
        assert cache.cached([], env, lambda: compute("again")) == answer("again")
        assert cache.read(entry, 0) == answer("again")  # rewritten whole
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    assert cache.cached([], env, lambda: compute("off")) == answer("off")
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "file" / "cache"))  # a folder that cannot be made
    assert cache.cached([], env, lambda: compute("unwritable")) == answer("unwritable")
    assert computed == ["first", "again", "again", "off", "unwritable"]


def test_a_write_removes_the_entries_nothing_has_used_for_a_month(tmp_path, monkeypatch):
    """Every edit of the package makes new keys: a write removes entries, locks and torn writes unused for
    KEEP_DAYS, never a file the cache did not make, and a read keeps its entry in use."""
    import os

    from pipeline.training import fingerprint_cache as cache

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    stale = time.time() - (cache.KEEP_DAYS + 1) * 86400
    for kernels in ("avx2", "default"):
        cache.cached([], {"ATEN_CPU_CAPABILITY": kernels}, answer)
    unused, read = sorted(tmp_path.glob("*.json"))  # one left unused, one read below
    for path in [*tmp_path.glob("*.json"), *tmp_path.glob("*.lock")]:
        os.utime(path, (stale, stale))
    for name in ("tmpleftbyakilledwriter.tmp", "notes.json"):  # a torn write; a file the cache did not make
        (tmp_path / name).write_text("{")
        os.utime(tmp_path / name, (stale, stale))
    read_key = next(k for k in ("avx2", "default") if cache.key([], {"ATEN_CPU_CAPABILITY": k}) == read.stem)
    assert cache.cached([], {"ATEN_CPU_CAPABILITY": read_key}, lambda: answer("again")) == answer()  # a hit
    cache.cached([], {"ATEN_CPU_CAPABILITY": "avx512"}, answer)  # a write: the month-old go
    left = sorted(p.name for p in tmp_path.iterdir())
    assert unused.name not in left and f"{unused.stem}.lock" not in left and "tmpleftbyakilledwriter.tmp" not in left
    assert read.name in left and f"{read.stem}.lock" in left and "notes.json" in left
    assert len(left) == 5  # the read one, the new one (each with its lock), and what the cache did not make


def test_processes_missing_one_key_compute_it_once(tmp_path, monkeypatch):
    """The second waits for the first's answer instead of spending its own CPU seconds on it."""
    import threading

    from pipeline.training import fingerprint_cache as cache

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    inside, computed = threading.Event(), []

    def compute():
        computed.append(threading.current_thread().name)
        first = not inside.is_set()
        inside.set()
        if first:
            time.sleep(1.0)  # the other thread is asking meanwhile
        return answer()

    threads = [threading.Thread(target=cache.cached, args=([], {}, compute), name=n) for n in "ab"]
    threads[0].start()
    assert inside.wait(30)
    threads[1].start()
    for t in threads:
        t.join()
    assert computed == ["a"]


def test_the_cache_key_follows_the_code_configuration_processor_and_kernel_settings(tmp_path, monkeypatch, params):
    import shutil

    from pipeline.core import registry
    from pipeline.training import fingerprint_cache as cache

    small = fp.fingerprint_config(run_config(params, "capsnet_r3_recon", 0))
    env = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "CAPSNET_GIT_COMMIT": "a", "PYTHONPATH": "/a"}
    base = cache.key([small], env)
    assert base == cache.key([small], env | {"CAPSNET_GIT_COMMIT": "b", "PYTHONPATH": "/b", "PYTEST_CURRENT_TEST": "t",
                                            "TORCHINDUCTOR_CACHE_DIR": "/gpu/inductor"})  # a GPU session's jobs'
    assert base == cache.key([small], env | {"KMP_DUPLICATE_LIB_OK": "True"})  # what importing MLflow sets
    assert base != cache.key([small], env | {"KMP_AFFINITY": "compact"})
    assert base != cache.key([small], env | {"TORCH_USE_RTLD_GLOBAL": "1"})
    assert len({base, cache.key([], env), cache.key([small, small], env),
                cache.key([fp.fingerprint_config(run_config(params, "capsnet_r1_recon", 0))], env),
                cache.key([small], env | {"MKL_CBWR": "AUTO"}), cache.key([small], env | {"OMP_NUM_THREADS": "4"}),
                cache.key([small], env | {"LD_PRELOAD": "libother.so"})}) == 7
    with monkeypatch.context() as patch:
        patch.setattr(cache, "processor", lambda: "another processor")
        assert cache.key([small], env) != base
    with monkeypatch.context() as patch:  # another C library: another libm
        patch.setattr(cache.platform, "libc_ver", lambda: ("glibc", "2.99"))
        assert cache.key([small], env) != base
    with monkeypatch.context() as patch:
        patch.setattr(cache, "code_digest", lambda root=cache.PACKAGE: "other code")
        assert cache.key([small], env) != base
    # the code: every file of the package, however deep, its compiled bytecode aside
    copy = tmp_path / "pipeline"
    shutil.copytree(cache.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert cache.code_digest(copy) == cache.code_digest()
    (copy / "models" / "__pycache__").mkdir()
    (copy / "models" / "__pycache__" / "capsnet.cpython-311.pyc").write_bytes(b"\0")
    assert cache.code_digest.__wrapped__(copy) == cache.code_digest()
    (copy / "models" / "capsnet.py").write_text((copy / "models" / "capsnet.py").read_text() + "\n")
    assert cache.code_digest.__wrapped__(copy) != cache.code_digest()
    # an experiment registered from outside the package: its code is in no key, so nothing is kept
    registry.register(type("Outside", (), {"NAME": "outside", "__name__": "outside"}))
    try:
        assert cache.key([small], env) is None
    finally:
        registry.unregister("outside")


def test_the_capped_process_answers_from_the_cache_once_it_holds_the_answer(tmp_path, monkeypatch):
    from pipeline.training import fingerprint_cache as cache

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    computed = fp.in_capped_process([])
    assert [cache.read(p, 0) for p in tmp_path.glob("*.json")] == [computed]

    def no_process(*args, **kwargs):
        raise AssertionError("a capped process started for a kept answer")

    monkeypatch.setattr(fp.subprocess, "run", no_process)
    assert fp.in_capped_process([]) == computed


def test_the_cache_lives_where_its_variable_or_xdg_says_and_off_keeps_nothing(tmp_path, monkeypatch):
    from pipeline.training import fingerprint_cache as cache

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    computed = []
    for _ in range(2):
        cache.cached([], {}, lambda: computed.append(1) or answer())
    assert cache.folder() is None and computed == [1, 1] and list(tmp_path.iterdir()) == []  # no folder named off
    monkeypatch.delenv(cache.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.folder() == tmp_path / "xdg" / "capsnet-repro" / "fingerprints"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.folder() == tmp_path / "home" / ".cache" / "capsnet-repro" / "fingerprints"


def test_the_key_follows_the_python_the_torch_build_and_each_files_name_and_bytes(tmp_path, monkeypatch):
    """Another interpreter, torch version or libtorch_cpu build (its size or its time) is another key; so
    is a package file renamed with its bytes, or edited to the same size."""
    import os
    import shutil
    import types

    from pipeline.training import fingerprint_cache as cache

    lib = tmp_path / "torch" / "lib" / "libtorch_cpu.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"build")
    os.utime(lib, ns=(10**18, 10**18))
    monkeypatch.setattr(cache, "torch", types.SimpleNamespace(__file__=str(lib.parents[1] / "__init__.py"),
                                                              __version__="2.15.0"))
    base = cache.key([], {})
    with monkeypatch.context() as patch:
        patch.setattr(cache.sys, "executable", "/another/python3")
        assert cache.key([], {}) != base
    with monkeypatch.context() as patch:
        patch.setattr(cache.torch, "__version__", "2.16.0")
        assert cache.key([], {}) != base
    lib.write_bytes(b"build, rebuilt")
    os.utime(lib, ns=(10**18, 10**18))
    assert cache.key([], {}) != base
    lib.write_bytes(b"build")
    os.utime(lib, ns=(10**18, 10**18))
    assert cache.key([], {}) == base
    os.utime(lib, ns=(2 * 10**18, 2 * 10**18))  # rebuilt to the same size
    assert cache.key([], {}) != base
    copy = tmp_path / "pipeline"
    shutil.copytree(cache.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    models = copy / "models"
    (models / "capsnet.py").rename(models / "capsnet_renamed.py")
    assert cache.code_digest.__wrapped__(copy) != cache.code_digest()
    (models / "capsnet_renamed.py").rename(models / "capsnet.py")
    source = (models / "capsnet.py").read_bytes()
    (models / "capsnet.py").write_bytes(source[:-1] + (b" " if source[-1:] != b" " else b"#"))  # its size kept
    assert cache.code_digest.__wrapped__(copy) != cache.code_digest()


def test_the_processors_fields_are_the_first_of_their_exact_name(tmp_path, monkeypatch):
    from pipeline.training import fingerprint_cache as cache

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nmodel\t\t: 1\n"
                    "flags\t\t: avx2 fma\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon\n"
                    "model\t\t: 2\nflags\t\t: avx512f\n")
    monkeypatch.setattr(cache, "CPUINFO", info)
    fields = ("vendor_id", "model", "model name", "Features")
    assert [cache.cpuinfo(f) for f in fields] == ["AuthenticAMD", "1", "AMD EPYC", ""]
    assert cache.processor.__wrapped__() == "vendor_id: AuthenticAMD; model name: AMD EPYC; flags: avx2 fma"
    monkeypatch.setattr(cache, "CPUINFO", tmp_path / "absent")  # not Linux
    assert cache.cpuinfo("vendor_id") == ""
    monkeypatch.setattr(cache.platform, "machine", lambda: "arm64")
    monkeypatch.setattr(cache.platform, "processor", lambda: "arm")
    assert cache.processor.__wrapped__() == "arm64 arm"


def test_an_entry_holds_the_answer_alone_written_whole_and_a_malformed_one_is_no_answer(tmp_path, monkeypatch):
    """The file is a temporary beside the entry renamed over it (a rename within one folder is whole); it
    holds the fingerprints and the environment, nothing else the computing returned; an entry whose
    fingerprints or environment are not strings, or not there, reads as no answer."""
    import os

    from pipeline.training import fingerprint_cache as cache

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    renamed, replace = [], os.replace
    monkeypatch.setattr(cache.os, "replace", lambda a, b: renamed.append((Path(a), Path(b))) or replace(a, b))
    cache.cached([], {}, lambda: answer() | {"log": "computed in 2 s"})
    (entry,) = tmp_path.glob("*.json")
    assert json.loads(entry.read_text()) == answer()
    ((temporary, target),) = renamed
    assert (temporary.parent, target) == (tmp_path, entry) and not temporary.exists()
    for malformed in ({"fingerprints": [1], "environment": "x"}, {"fingerprints": ["a"], "environment": None},
                      {"fingerprints": ["a"]}, {"fingerprints": 1, "environment": "x"}, ["a"]):
        entry.write_text(json.dumps(malformed))
        assert cache.read(entry, 1) is None, malformed


def test_a_cache_that_cannot_be_written_or_touched_still_answers(tmp_path, monkeypatch):
    from pipeline.training import fingerprint_cache as cache

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))

    with monkeypatch.context() as patch:
        patch.setattr(cache, "write", disk_full)
        assert cache.cached([], {}, answer) == answer()
    cache.cached([], {}, answer)  # kept this time: the next asking is a hit
    with monkeypatch.context() as patch:
        patch.setattr(cache.os, "utime", disk_full)
        assert cache.cached([], {}, lambda: answer("again")) == answer()  # the hit, untouched


def test_pruning_keeps_a_month_and_files_that_only_contain_a_keys_name_and_survives_one_gone(tmp_path):
    import os

    from pipeline.training import fingerprint_cache as cache

    def aged(name, days):
        (tmp_path / name).write_text("{}")
        then = time.time() - days * 86400
        os.utime(tmp_path / name, (then, then))

    aged(f"{'a' * 64}.json", 29)
    aged(f"{'b' * 64}.json", 31)
    aged(f"notes-{'c' * 64}.json.bak", 31)  # holds a key's name; not the cache's
    (tmp_path / f"{'d' * 64}.lock").symlink_to(tmp_path / "gone")  # removed by another process meanwhile
    cache.prune(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{'a' * 64}.json", f"{'d' * 64}.lock",
                                                          f"notes-{'c' * 64}.json.bak"]


def test_the_suites_answers_copied_out_are_found_there_without_computing_and_its_locks_stay(tmp_path, monkeypatch):
    """conftest.export_fingerprints (.ci/run hands the suite's fingerprints to its smoke): a cache pointed at
    the folder it fills answers each key the suite computed, and nothing half-written or lock-like goes there."""
    from conftest import export_fingerprints
    from pipeline.training import fingerprint_cache as cache

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "run"))
    envs = [{"ATEN_CPU_CAPABILITY": "avx2"}, {"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "1"}]
    for k, env in enumerate(envs):
        cache.cached([], env, lambda k=k: answer(f"computed {k}"))
    export_fingerprints(tmp_path / "run", tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in (tmp_path / "run").glob("*.json"))
    assert len(list((tmp_path / "run").glob("*.lock"))) == 2  # the run's locks are its own

    def never():
        raise AssertionError("computed what the copied cache holds")

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "out"))
    assert [cache.cached([], env, never)["environment"] for env in envs] == ["computed 0", "computed 1"]


def test_a_log_named_by_its_variable_gets_a_line_per_lookup_and_the_script_sums_them(tmp_path, monkeypatch, params, capsys):
    """$CAPSNET_FINGERPRINT_LOG: each lookup's variants, key, answer and seconds, its test named;
    scripts/fingerprint_log.py counts what was computed, found or not cached and names a key computed twice."""
    from pipeline.training import fingerprint_cache as cache

    fingerprint_log = script("fingerprint_log")
    log = tmp_path / "lookups.jsonl"
    monkeypatch.setenv(cache.LOG_ENV, str(log))
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_x.py::test_y (call)")
    small = fp.fingerprint_config(run_config(params, "capsnet_r3_recon", 0))

    def compute():
        time.sleep(0.2)
        return {"fingerprints": ["0123456789abcdef"], "environment": "e"}

    cache.cached([small], {}, compute)
    cache.cached([small], {}, compute)  # found
    for entry in (tmp_path / "cache").glob("*.json"):
        entry.unlink()
    cache.cached([small], {}, compute)  # computed again: the cache lost it
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "other"))
    cache.cached([small], {}, compute)  # computed in another folder: no failure to share
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    cache.cached([small, small], {}, compute)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["answer"] for e in lines] == ["computed", "found", "computed", "computed", "not cached"]
    assert [e["families"] for e in lines] == [["table1 capsnet r3 recon paper 28px"]] * 4 + [["table1 capsnet r3 recon paper 28px"] * 2]
    assert [e["key"] for e in lines] == [cache.key([small], {})] * 4 + [cache.key([small, small], {})]
    assert [e["cache"] for e in lines] == [str(tmp_path / "cache")] * 3 + [str(tmp_path / "other"), None]
    assert [e["test"] for e in lines] == ["tests/test_x.py::test_y"] * 4 + [None]
    assert all(e["compute_s"] >= 0.2 for e in lines if e["answer"] != "found") and lines[1]["compute_s"] < 0.2
    with log.open("a") as f:  # a stand-in computed twice (the cache's own tests do), then a torn line
        f.write("".join(json.dumps({**lines[0], "families": [], "key": "f" * 64}) + "\n" for _ in range(2)))
        f.write('{"families": ["torn"\n')
    assert fingerprint_log.main([str(log)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("7 lookups: 5 computed (1.0 s), 1 found (0.0 s), 1 not cached (0.2 s)\n")
    assert f"keys computed more than once in one cache folder: 1\n  {lines[0]['key'][:12]} in {tmp_path / 'cache'}: 2 times\n" in out
    assert "table1 capsnet r3 recon paper 28px + table1 capsnet r3 recon paper 28px  [not cached] no test" in out
    assert "(no configuration: a test's stand-in)  [computed] tests/test_x.py::test_y" in out
    assert "1 line(s) that are not a lookup left out" in err
    assert fingerprint_log.main([str(tmp_path / "none.jsonl")]) == 2
    assert "set CAPSNET_FINGERPRINT_LOG=" in capsys.readouterr().err
    monkeypatch.delenv(cache.LOG_ENV)
    cache.cached([small], {}, compute)
    assert len(log.read_text().splitlines()) == 8  # no variable, no line (the torn one is the eighth)
