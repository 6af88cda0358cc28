"""Command-line plumbing shared by the tools in cleanrl_utils: bad input is one `error:` line and exit 2."""

from __future__ import annotations

import argparse
import sys


class UsageError(Exception):
    """Bad input: reported as one `error:` line before any work starts."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise UsageError instead of printing argparse's usage block."""

    def error(self, message: str) -> None:
        raise UsageError(message)


def fail(message: str, status: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(status)
