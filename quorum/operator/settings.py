"""Settings of quorum-operator (environment variables `QUORUM_OPERATOR_*`)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class OperatorSettings:
    org: str | None = None
    """Only nodes labelled node.coreweave.cloud/reserved=<org> are used (None: any org)."""
    resync_seconds: float = 5.0
    release_concurrency: int = 32

    @classmethod
    def from_env(cls) -> OperatorSettings:
        env = os.environ
        return cls(
            org=env.get("QUORUM_OPERATOR_ORG") or None,
            resync_seconds=float(env.get("QUORUM_OPERATOR_RESYNC_SECONDS", "5")),
            release_concurrency=int(env.get("QUORUM_OPERATOR_RELEASE_CONCURRENCY", "32")),
        )
