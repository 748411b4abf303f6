"""The `quorum` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from quorum import __version__, install, upgrade
from quorum.commands import explain, get, uninstall, version
from quorum.operator import manual
from quorum.webhooks import certs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="quorum", description=__doc__)
    parser.add_argument("--version", action="version", version=f"quorum {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    certs.add_parser(subparsers)
    manual.add_parser(subparsers)
    install.add_parser(subparsers)
    upgrade.add_parser(subparsers)
    uninstall.add_parser(subparsers)
    get.add_parser(subparsers)
    explain.add_parser(subparsers)
    version.add_parser(subparsers)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
