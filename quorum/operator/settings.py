"""Settings of quorum-operator (environment variables `QUORUM_OPERATOR_*`)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class OperatorSettings:
    org: str | None = None
    """Only nodes labelled node.coreweave.cloud/reserved=<org> are used (None: any org)."""
    resync_seconds: float = 5.0
    release_concurrency: int = 128
    """Pod release patches in flight at once (the apiserver's default limit is 400 mutating)."""
    gang_concurrency: int = 64
    """Gangs whose writes (release, status, Events) are in flight at once."""
    forming_grace_seconds: float = 2.0
    """A gang short of members is written (Gang object, status, Events) only after this long."""
    status_interval_seconds: float = 1.0
    """One gang's status (and its group's) is written at most this often: the last state then."""
    namespace: str = "quorum-system"
    """Where the leader-election Lease lives (the operator's own namespace)."""
    lease_seconds: float = 15.0
    """Lease duration: a new leader takes over at most this long after the old one died."""
    backoff_seconds: float = 10.0
    """Wait before a gang that was partially placed is tried again; doubles each time in a row."""
    backoff_cap_seconds: float = 300.0
    """The longest wait between tries, however many partial placements in a row."""
    starvation_seconds: float = 60.0
    """A gang held this long for lack of room gets capacity held for it (one gang at a time)."""
    test_crash_after: int = 0
    """Tests only: SIGKILL the process after this many pod releases (0: never)."""

    @classmethod
    def from_env(cls) -> OperatorSettings:
        env = os.environ
        return cls(
            org=env.get("QUORUM_OPERATOR_ORG") or None,
            resync_seconds=float(env.get("QUORUM_OPERATOR_RESYNC_SECONDS", "5")),
            release_concurrency=int(env.get("QUORUM_OPERATOR_RELEASE_CONCURRENCY", "128")),
            gang_concurrency=int(env.get("QUORUM_OPERATOR_GANG_CONCURRENCY", "64")),
            forming_grace_seconds=float(env.get("QUORUM_OPERATOR_FORMING_GRACE_SECONDS", "2")),
            status_interval_seconds=float(env.get("QUORUM_OPERATOR_STATUS_INTERVAL_SECONDS", "1")),
            namespace=env.get("QUORUM_OPERATOR_NAMESPACE", "quorum-system"),
            lease_seconds=float(env.get("QUORUM_OPERATOR_LEASE_SECONDS", "15")),
            backoff_seconds=float(env.get("QUORUM_OPERATOR_BACKOFF_SECONDS", "10")),
            backoff_cap_seconds=float(env.get("QUORUM_OPERATOR_BACKOFF_CAP_SECONDS", "300")),
            starvation_seconds=float(env.get("QUORUM_OPERATOR_STARVATION_SECONDS", "60")),
            test_crash_after=int(env.get("QUORUM_OPERATOR_TEST_CRASH_AFTER", "0")),
        )
