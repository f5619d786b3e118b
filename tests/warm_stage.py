"""The warm server's two halves that a real server hides, run in a process of their own (never a test's:
a forked stage runs every atexit function its process registered, a test process's temporary folders'
clean-ups included):

    python tests/warm_stage.py accept OUT COMMAND [ARG ...]   # one stage, as the server's `_accept` forks it
    python tests/warm_stage.py reap OUT                       # `_reap` with two stages ended at once

`accept` replaces the `capsnet` command (pipeline.cli.main) by STAGE, a group whose commands end in each
way a command can and write what the stage process saw into OUT; it hands `_accept` a request over a
socket pair, as `capsnet` sends one, its stdout a pseudo-terminal with ``--tty``, its environment this
process's plus OUT/request.json's "env", the server's imported settings OUT/request.json's "imported";
it waits for the stage and writes OUT/result.json: the exit status the server read, the one it sent the
client, the stage's stdout and stderr. `reap` writes OUT/result.json: the exit status each client got.
"""

from __future__ import annotations

import atexit
import json
import os
import pty
import selectors
import socket
import sys
import time
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline import cli, warm  # noqa: E402


def proc_stat(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command's name: [state, parent pid, ...]."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


@click.group()
def STAGE() -> None:
    """The stand-in `capsnet`."""


@STAGE.command()
@click.argument("out", type=click.Path())
def sees(out: str) -> None:
    """Write what the stage sees: its environment, directory and stdout's buffering; print a last line
    without flushing it."""
    Path(out, "seen.json").write_text(json.dumps({"env": dict(os.environ), "cwd": os.getcwd(),
                                                  "line_buffering": sys.stdout.line_buffering}))
    atexit.register(lambda: Path(out, "atexit").write_text("ran"))
    print("a last line, unflushed")


@STAGE.command()
@click.argument("how", type=click.Choice(["message", "bare", "none", "raise"]))
def ends(how: str) -> None:
    """End by sys.exit("…"), sys.exit(), sys.exit(None), or an exception nobody catches."""
    if how == "message":
        sys.exit("the stage stopped: its message")
    if how == "bare":
        sys.exit()
    if how == "none":
        sys.exit(None)
    raise RuntimeError("nobody catches this")


def accept(out: Path, argv: list[str], tty: bool) -> None:
    request_file = json.loads((out / "request.json").read_text()) if (out / "request.json").is_file() else {}
    cli.main = STAGE  # what _child imports as the command (the fork copies this process)
    server_env = {k: v for k, v in os.environ.items() if k != warm.THREADS_ENV}  # no thread count: the stage imports no torch
    env = {**server_env, **request_file.get("env", {})}
    client, server = socket.socketpair()
    stdout_file, stderr_file = open(out / "stdout", "w+b"), open(out / "stderr", "w+b")
    terminal, stdout = pty.openpty() if tty else (None, stdout_file.fileno())
    with open(os.devnull, "rb") as stdin:
        socket.send_fds(client, [b"F"], [stdin.fileno(), stdout, stderr_file.fileno()])
    request = {"argv": ["capsnet", *argv], "cwd": str(out), "env": env, "package": str(warm.PACKAGE)}
    client.sendall(json.dumps(request).encode() + b"\n")
    pid = warm._accept(server, warm.fingerprint(), server_env, request_file.get("imported", {}), keep=())
    children = {pid: server}
    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ, pid)
    while children:  # the server's loop, as a SIGCHLD wakes it
        warm._reap(children, selector)
        time.sleep(0.05)
    replies = client.makefile("rb")
    started, ended = json.loads(replies.readline()), json.loads(replies.readline())
    if tty:
        os.close(stdout), os.close(terminal)
    stdout_file.seek(0), stderr_file.seek(0)
    (out / "result.json").write_text(json.dumps({
        "started": started, "exit": ended["exit"], "stdout": stdout_file.read().decode(),
        "stderr": stderr_file.read().decode()}))


def reap(out: Path) -> None:
    """Two stages that end at once, reaped by one `_reap` (one SIGCHLD can stand for both)."""
    children, clients, selector = {}, {}, selectors.DefaultSelector()
    for code in (3, 4):
        client, server = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            os._exit(code)
        children[pid], clients[code] = server, client
        selector.register(server, selectors.EVENT_READ, pid)
    for pid in children:  # both ended, neither reaped: zombies
        while proc_stat(pid)[0] != "Z":
            time.sleep(0.01)
    warm._reap(children, selector)
    got = {}
    for code, client in clients.items():
        client.setblocking(False)
        try:
            got[code] = json.loads(client.makefile("rb").readline())["exit"]
        except (BlockingIOError, ValueError):
            got[code] = None
    (out / "result.json").write_text(json.dumps({"exits": got, "left": len(children)}))


if __name__ == "__main__":
    what, folder = sys.argv[1], Path(sys.argv[2])
    if what == "accept":
        tty = "--tty" in sys.argv
        accept(folder, [a for a in sys.argv[3:] if a != "--tty"], tty)
    else:
        reap(folder)
