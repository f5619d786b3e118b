"""Errors that are the user's to fix. The CLI prints their message as one line, never a traceback,
so each message names what is wrong and what to do about it."""


class UserError(Exception):
    """Bad input or state: a params value, a file, a device, a path."""


class Terminated(BaseException):
    """SIGTERM arrived (DVC, a scheduler or `kill` stopping a stage): unwind, marking runs FAILED.
    A BaseException, like KeyboardInterrupt, so no `except Exception` swallows it."""


def first_line(err: BaseException, limit: int = 160) -> str:
    """An exception as one short line for a one-line message: its message's first line, cut at
    ``limit`` characters, or its type's name when it has no message."""
    text = str(err).strip()
    return text.splitlines()[0][:limit] if text else type(err).__name__
