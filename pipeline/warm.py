"""A warm interpreter for runs of many short stage processes (`make smoke`: 48 stages).

A smoke stage computes for a second or two and spends about 5 s importing torch, MLflow and
matplotlib. `python -m pipeline.warm serve SOCKET` imports them once, then listens on a Unix
socket. With $CAPSNET_WARM naming that socket, the `capsnet` command (this module's `main`) sends
its arguments, working directory, environment and stdin/stdout/stderr there, and the server forks
the stage from its warm process: each stage is still its own process, started by DVC as before,
running the same click command with its own directory, environment, streams and exit status.
SIGINT/SIGTERM/SIGHUP sent to `capsnet` reach the stage (the trainer's checkpoint-and-fail path),
and a `capsnet` killed outright takes its stage down with it (SIGTERM).

The server refuses, and `capsnet` starts cold as it always does, when a pipeline/*.py file
changed since the server started (it would run the old code), when an import-time setting
differs (OMP_*, PYTHON*, ...: read once, when the server imported torch), or when it runs another
checkout's package. No socket, no server, $CAPSNET_WARM unset: cold.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

WARM_ENV = "CAPSNET_WARM"
PACKAGE = Path(__file__).resolve().parent
# read when a library loads (OpenMP's thread count, Python's own flags, ...): a stage whose value
# differs from the server's would not get its own, so it starts cold
IMPORT_TIME_ENV = ("OMP_", "MKL_", "KMP_", "OPENBLAS_", "GOMP_", "PYTHON", "TORCH", "MPL", "LD_", "CUBLAS_")
# except torch's CPU thread count, which the stage process sets itself (torch.set_num_threads, as
# torch does from it at import): the fan-out gives each slot its share of the cores this way
THREADS_ENV = "OMP_NUM_THREADS"
# what a stage process imports: torch (and torch._dynamo, which building an optimizer imports: about 2 s),
# MLflow's client and sqlite store, matplotlib, every stage, and the scipy parts the report's statistics
# import when first called (pipeline/report/stats.py, power.py)
PRELOAD = ("torch", "torch._dynamo", "mlflow", "mlflow.tracking", "mlflow.store.tracking.sqlalchemy_store", "pipeline.cli",
           "pipeline.stages.prepare", "pipeline.stages.train", "pipeline.stages.evaluate", "pipeline.stages.report",
           "scipy.stats", "scipy.optimize")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# held from the fork until the stage has its own handlers: it inherits the server's, which catch a stop
# (a flag nobody reads there), so a SIGTERM sent in between would leave the stage running, its server gone
HELD = (signal.SIGCHLD, *FORWARDED)


def main() -> None:
    """The `capsnet` command: forked warm where $CAPSNET_WARM's server takes it, else run here."""
    address = os.environ.get(WARM_ENV)
    if address:
        code = forward(address, sys.argv)
        if code is not None:
            sys.exit(code)
    from pipeline.cli import main as cli_main

    cli_main()


@contextlib.contextmanager
def running(log: Path) -> Iterator[str | None]:
    """A server for the block's duration (its output in ``log``): its socket address, or None,
    saying why, where it did not start (the stages then start cold)."""
    folder = tempfile.mkdtemp(prefix="capsnet-warm-")  # short: a socket's path has a 107-byte limit
    address = os.path.join(folder, "socket")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:  # its own session: a Ctrl-C reaches the stages through `capsnet` only
        # -P: the package `capsnet` imports (the installed one), not one the working directory holds
        server = subprocess.Popen([sys.executable, "-P", "-m", "pipeline.warm", "serve", address], stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(address) and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if os.path.exists(address):
            yield address
        else:
            print(f"warm: the server did not start (see {log}); every stage starts cold", file=sys.stderr)
            yield None
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(folder, ignore_errors=True)


def forward(address: str, argv: list[str]) -> int | None:
    """Run ``argv`` in the warm server at ``address``: its exit status, or None to start cold."""
    # which of stdin/stdout/stderr are open, asked before anything here opens a descriptor: a closed
    # one's number is the lowest free, and the socket would take it and reach the stage in its place
    is_open = [_is_open(fd) for fd in (0, 1, 2)]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
    except OSError:
        sock.close()
        return None  # no server (it was stopped, or never started): cold, as without $CAPSNET_WARM
    with sock, open(os.devnull, "rb+") as devnull:
        streams = [fd if there else devnull.fileno() for fd, there in zip((0, 1, 2), is_open)]
        socket.send_fds(sock, [b"F"], streams)
        request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "package": str(PACKAGE)}
        sock.sendall(json.dumps(request).encode() + b"\n")
        replies = sock.makefile("rb")
        first = json.loads(replies.readline() or b"{}")
        if "refused" in first:
            print(f"capsnet: starting cold ({first['refused']})", file=sys.stderr)
            return None
        pid = first["pid"]
        for sig in FORWARDED:
            signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))
        last = json.loads(replies.readline() or b"{}")
    if "exit" not in last:
        print("capsnet: the warm interpreter stopped before the stage ended", file=sys.stderr)
        return 1
    return last["exit"]


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def fingerprint() -> dict[str, str]:
    """The package's code as the server imported it: every pipeline/**/*.py's SHA-256 (contents, not
    times: `dvc exp run` rewrites the workspace's files as they were)."""
    return {str(p.relative_to(PACKAGE)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(PACKAGE.rglob("*.py"))}


def refusal(request: dict, code: dict, env: dict[str, str]) -> str | None:
    """Why the server cannot run ``request`` as a cold process would, or None."""
    if request["package"] != str(PACKAGE):
        return f"the warm interpreter runs {PACKAGE}, not {request['package']}"
    now = fingerprint()
    changed = sorted(name for name in code.keys() | now.keys() if code.get(name) != now.get(name))
    if changed:
        return f"pipeline/{changed[0]} changed since the warm interpreter started"
    keys = {k for k in set(env) | set(request["env"]) if k.startswith(IMPORT_TIME_ENV)}
    differ = sorted(k for k in keys if env.get(k) != request["env"].get(k)
                    and not (k == THREADS_ENV and thread_count(request["env"].get(k))))
    if differ:
        return f"{', '.join(differ)} differ from the warm interpreter's"
    return None


def thread_count(value: str | None) -> int | None:
    """OMP_NUM_THREADS as a positive thread count, or None (unset, or what torch would not take)."""
    return int(value) if value and value.isdigit() and int(value) > 0 else None


def serve(address: str) -> None:
    """Import what stages import, listen on ``address`` (a Unix socket, created once ready), and
    fork one process per request until SIGTERM/SIGINT; children still running are terminated."""
    start, env = time.perf_counter(), dict(os.environ)
    for name in PRELOAD:
        __import__(name)
    code = fingerprint()
    # what the imports themselves set (torch's TORCHINDUCTOR_CACHE_DIR, say): a cold stage sets it
    # as it imports them, so each child gets it too, unless its own environment sets it
    imported_env = {k: v for k, v in os.environ.items() if env.get(k) != v}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)  # the socket appears now: who waits for it knows the imports are done
    listener.listen(64)
    print(f"warm: {len(PRELOAD)} modules imported in {time.perf_counter() - start:.1f} s; serving {address}", flush=True)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False), os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stopping: list[int] = []
    _server_signals(stopping)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    try:
        while not stopping:
            for key, _ in selector.select():
                if key.fileobj is listener:
                    conn, _ = listener.accept()
                    pid = _accept(conn, code, env, imported_env, keep=(listener, wake_r, wake_w, *children.values()))
                    if pid is None:
                        conn.close()
                    else:
                        children[pid] = conn
                        selector.register(conn, selectors.EVENT_READ, pid)
                elif key.fileobj == wake_r:
                    while _drain(wake_r):
                        pass
                    _reap(children, selector)
                elif not key.fileobj.recv(1):  # the client is gone (killed): so is its stage
                    selector.unregister(key.fileobj)
                    _kill(key.data)
    finally:
        for pid in children:
            _kill(pid)
        listener.close()
        Path(address).unlink(missing_ok=True)


def _server_signals(stopping: list[int]) -> None:
    """The server's handlers: SIGCHLD wakes its selector (a child ended); SIGTERM/SIGINT, noted in
    ``stopping``, end its loop."""
    signal.signal(signal.SIGCHLD, lambda *_: None)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))


def _accept(conn: socket.socket, code: dict, env: dict, imported_env: dict, keep: tuple) -> int | None:
    """Read a request from ``conn``; fork its stage (the child never returns). The child's pid, or
    None when refused."""
    conn.settimeout(10)
    _, fds, _, _ = socket.recv_fds(conn, 1, 3)
    request = json.loads(conn.makefile("rb").readline())
    reason = refusal(request, code, env)
    if reason is not None:
        conn.sendall(json.dumps({"refused": reason}).encode() + b"\n")
        for fd in fds:
            os.close(fd)
        return None
    sys.stdout.flush(), sys.stderr.flush()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)  # the child unblocks them once its handlers are set
    pid = os.fork()
    if pid == 0:
        _child({**request, "env": {**imported_env, **request["env"]}}, fds, closing=(conn, *keep))
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    print(f"warm: pid {pid}: {' '.join(request['argv'][1:])}", flush=True)
    return pid


def _child(request: dict, fds: list[int], closing: tuple) -> None:
    """The stage process: the client's streams, directory and environment, then the command."""
    status = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in HELD:  # a stage's own handlers: Python's defaults
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)  # a stop sent since the fork lands now, on these
        for item in closing:
            item.close() if hasattr(item, "close") else os.close(item)
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdout.reconfigure(line_buffering=os.isatty(1))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if threads := thread_count(os.environ.get(THREADS_ENV)):
            import torch

            torch.set_num_threads(threads)
        sys.argv = request["argv"]
        from pipeline.cli import main as cli_main

        try:
            cli_main.main(args=sys.argv[1:], prog_name=Path(sys.argv[0]).name)  # click exits: SystemExit
        except SystemExit as done:
            status = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
            if status and not isinstance(done.code, int):
                print(done.code, file=sys.stderr)  # sys.exit("message"), as the interpreter prints it
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            import atexit

            atexit._run_exitfuncs()  # what a process ending normally runs (logging's, MLflow's)
            sys.stdout.flush(), sys.stderr.flush()
        finally:
            os._exit(status)


def _drain(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False


def _reap(children: dict[int, socket.socket], selector: selectors.BaseSelector) -> None:
    """Send each ended child's exit status (as a shell gives it: 128 + N for signal N) to its client."""
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        try:
            conn.sendall(json.dumps({"exit": code if code >= 0 else 128 - code}).encode() + b"\n")
        except OSError:
            pass  # the client is gone
        with contextlib.suppress(KeyError):  # already gone when its client died first
            selector.unregister(conn)
        conn.close()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "serve":
        sys.exit("usage: python -m pipeline.warm serve SOCKET")
    serve(sys.argv[2])
