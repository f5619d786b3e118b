"""What every `capsnet` command shares: the input folders an earlier step makes (their error names
that step), the --params option, and the wrapper that turns the user's errors into one line."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from pipeline.core.errors import Terminated, UserError


class Made(click.Path):
    """An input folder an earlier step makes: when it does not exist, the one-line error says which
    command makes it (click's own says only that it does not exist)."""

    def __init__(self, made_by: str):
        super().__init__(exists=True, file_okay=False)
        self.made_by = made_by

    def convert(self, value, param, ctx):
        if not Path(value).exists():
            self.fail(f"folder {str(value)!r} does not exist: {self.made_by}", param, ctx)
        return super().convert(value, param, ctx)


PREPARED = Made("`dvc repro prepare` makes it (or `capsnet prepare`)")
TRAINED = Made("the train stages make it (`dvc repro`; `capsnet stages --kind stages` lists them)")
EVALUATED = Made("the evaluate stages make it (`dvc repro`; `capsnet stages --kind stages` lists them)")

PARAMS_OPTION = click.option("--params", "params_path", default="params.yaml", show_default=True,
                             type=click.Path(dir_okay=False), help="params.yaml to read")


def user_errors(command):
    """Turn a UserError raised by the stage into click's one-line `Error: …` (exit status 1), and
    a SIGTERM into one line and status 143 (128 + 15), as a shell reports a terminated command."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except UserError as err:
            raise click.ClickException(str(err)) from err
        except Terminated as err:
            click.echo(f"Terminated: {err}; the run is marked FAILED and resumes from its checkpoint", err=True)
            sys.exit(143)
    return wrapper
