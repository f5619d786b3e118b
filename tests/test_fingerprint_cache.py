"""The disk cache of training fingerprints (pipeline.training.fingerprint_cache): computed once per code,
configuration and environment, kept whole or not at all, shared by processes."""

import json
import time

import pytest

from pipeline.core.params import load_params
from pipeline.training import fingerprint as fp
from pipeline.training.config import run_config

from conftest import REPO


@pytest.fixture(scope="module")
def params():
    return load_params(REPO / "params.yaml")


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
