"""Entry point of the `quorum-operator` process."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from quorum import __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="quorum-operator",
        description="quorum's gang admission operator (kopf, standalone, Lease-elected).",
    )
    parser.add_argument("--version", action="version", version=f"quorum-operator {__version__}")
    parser.parse_args(argv)
    # The gang admission loop is built by the gang admission issue; until then, say so.
    print("quorum-operator: gang admission is not part of this release yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
