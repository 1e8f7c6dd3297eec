"""``gradsift argv`` run in the test's own process, as a user would see it."""

from __future__ import annotations

import traceback

from gradsift.lab import cli

__all__ = ["run_cli"]


def run_cli(argv, capsys):
    """(exit code, stderr lines) of ``gradsift argv``. An exception that escapes
    ``main`` is what a user sees as a traceback: code ``"traceback"`` and its lines."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse exits itself
        code = exc.code
    except BaseException:  # noqa: BLE001 - the traceback a user would see
        return "traceback", traceback.format_exc().strip().splitlines()
    return code, capsys.readouterr().err.strip().splitlines()
