"""Settings of quorum-operator, from environment variables `QUORUM_OPERATOR_<FIELD>` (e.g.
`QUORUM_OPERATOR_RESYNC_SECONDS=5`); a value that is not of the field's type stops the
process at start with the variable named."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from quorum.core.lifecycle import MemberLossPolicy
from quorum.install import DEFAULT_NAMESPACE


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QUORUM_OPERATOR_", frozen=True, extra="ignore")

    org: str | None = None
    """Only nodes labelled node.coreweave.cloud/reserved=<org> are used (None: any org)."""
    resync_seconds: float = Field(default=5.0, gt=0)
    """A scheduling pass at least this often, even without events."""
    release_concurrency: int = Field(default=128, ge=1)
    """Pod release patches in flight at once (the apiserver's default limit is 400 mutating)."""
    gang_concurrency: int = Field(default=64, ge=1)
    """Gangs whose work (release, status, recovery) runs at once."""
    gang_timeout_seconds: float = Field(default=30.0, gt=0)
    """One gang's work is cut off after this long (a hung request); it is retried with backoff."""
    forming_grace_seconds: float = Field(default=2.0, ge=0)
    """A gang short of members is written (Gang object, status, Events) only after this long."""
    status_interval_seconds: float = Field(default=1.0, ge=0)
    pass_gap_factor: float = Field(default=5.0, ge=0)
    """After a pass that took t, the next starts no sooner than this x t later (at most 1 s; 0: at
    once): a busy loop spends at most 1/(1+factor) of a core on passes."""
    """One gang's status (and its group's) is written at most this often: the last state then."""
    namespace: str = DEFAULT_NAMESPACE
    """The operator's own namespace, where its leader-election Lease lives (the Deployment sets
    it from the pod's namespace)."""
    lease_seconds: float = Field(default=15.0, ge=3)
    """Lease duration: a new leader takes over at most this long after the old one died."""
    liveness_seconds: float = Field(default=60.0, gt=0)
    """/healthz fails when this replica leads and no scheduling pass completed for this long."""
    backoff_seconds: float = Field(default=10.0, ge=0)
    """Wait before a gang that was partially placed is tried again; doubles each time in a row."""
    backoff_cap_seconds: float = Field(default=300.0, ge=0)
    """The longest wait between tries, however many partial placements in a row."""
    starvation_seconds: float = Field(default=60.0, ge=0)
    """A gang held this long for lack of room gets capacity held for it (one gang at a time)."""
    preemption: bool = True
    """Held gangs take the room of lower-priority work (docs/preemption.md); false: they wait."""
    preemption_timeout_seconds: float = Field(default=180.0, gt=0)
    """A preemption whose gang has not bound by then ends: the nodes reserved for it are freed."""
    preemption_retry_seconds: float = Field(default=10.0, ge=0)
    """A held gang for which preemption found nothing to take is asked again after this long."""
    member_loss_policy: MemberLossPolicy = MemberLossPolicy.REPLACE
    """What a running gang that drops below minMember gets, unless its annotation
    quorum.dev/member-loss-policy says otherwise: Replace (its replacements are released alone)
    or RestartGang (the rest is evicted and the gang admitted again whole); docs/lifecycle.md."""
    test_crash_after: int = Field(default=0, ge=0)
    """Tests only: SIGKILL the process after this many pod releases (0: never)."""

    @field_validator("org")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return value or None

    @classmethod
    def from_env(cls) -> OperatorSettings:
        return cls()
