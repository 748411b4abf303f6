"""Settings of quorum-operator, from environment variables `QUORUM_OPERATOR_<FIELD>` (e.g.
`QUORUM_OPERATOR_RESYNC_SECONDS=5`); a value that is not of the field's type stops the
process at start with the variable named. `LoopSettings` is what the scheduling loop takes,
made from them at start (tests make it directly)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

import yaml
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from quorum.core.fit import FitSettings
from quorum.core.gangs import COSCHEDULER_NAMES, DEFAULT_SCHEDULER, Placer
from quorum.core.lifecycle import BackoffPolicy, MemberLossPolicy
from quorum.core.planner import PlannerSettings
from quorum.core.preemption import PreemptionSettings
from quorum.install import DEFAULT_NAMESPACE

PREFIX = "QUORUM_OPERATOR_"


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, frozen=True, extra="ignore")

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
    """One gang's status (and its group's) is written at most this often: the last state then."""
    pass_gap_factor: float = Field(default=5.0, ge=0)
    """After a pass that took t, the next starts no sooner than this x t later (at most 1 s; 0: at
    once): a busy loop spends at most 1/(1+factor) of a core on passes."""
    namespace: str = DEFAULT_NAMESPACE
    """The operator's own namespace, where its leader-election Lease lives (the Deployment sets
    it from the pod's namespace)."""
    lease_seconds: float = Field(default=15.0, ge=3)
    """Lease duration: a new leader takes over at most this long after the old one died. Taken as
    6 when shorter: the renewal timings are derived from it so that a leader stops acting a margin
    before another could take the Lease (quorum.operator.leader.LeaseSettings.for_duration)."""
    liveness_seconds: float = Field(default=60.0, gt=0)
    """/healthz fails when this replica leads and no scheduling pass completed for this long."""
    backoff_seconds: float = Field(default=10.0, ge=0)
    """Wait before a gang that was partially placed is tried again; doubles each time in a row."""
    backoff_cap_seconds: float = Field(default=300.0, ge=0)
    """The longest wait between tries, however many partial placements in a row."""
    starvation_seconds: float = Field(default=60.0, ge=0)
    """A gang held this long for lack of room gets capacity held for it (one gang at a time)."""
    starvation_hold_seconds: float = Field(default=300.0, gt=0)
    """Starving gangs hold capacity in turns of this long, in queue order."""
    starvation_rest_seconds: float = Field(default=0.0, ge=0)
    """After a turn, a starving gang rests this long, held or not (0: no rest)."""
    starvation_max_share: float = Field(default=1.0, gt=0, le=1)
    """The largest share of the nodes its pods may use that one starving gang holds; a gang that
    needs more holds none (docs/threat-model.md: a gang that can never fit cannot capture it)."""
    starvation_idle_seconds: float = Field(default=1800.0, ge=0)
    """A starving gang whose held room has not grown for this long holds nothing for as long,
    then holds again (0: no bound)."""
    tenant_label: str = Field(default="", max_length=317)
    """A namespace label whose value names the tenant of the namespace's gangs, for fairness
    (namespaces with the same value are one tenant); empty: each namespace is a tenant."""
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

    placement: Placer = Placer.QUORUM
    """Who places gang pods (docs/placement.md): `quorum`, which releases each gang from its gate
    once all of it fits; or `kube-scheduler`, whose gang cycle places each gang as the Kubernetes
    PodGroup its pods name (quorum makes that PodGroup for gangs of other dialects, and reports).
    The install renders the same value into the webhooks' settings (chart value `placement`)."""
    coscheduler_names: Annotated[tuple[str, ...], NoDecode] = COSCHEDULER_NAMES
    """Scheduler names quorum takes besides the default scheduler's (the webhooks rewrite them to
    it); a gang pod asking for any other is left to that scheduler, with an Event. Written as the
    manifests write it, `['a', 'b']` (or `a,b`); the install renders the same list into the
    webhooks' settings and the policies' CEL (chart values `schedulers`)."""

    @field_validator("org")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return value or None

    @field_validator("coscheduler_names", mode="before")
    @classmethod
    def _a_list(cls, value: object) -> object:
        if isinstance(value, str):
            parsed = yaml.safe_load(value) if value.lstrip().startswith("[") else value.split(",")
            if isinstance(parsed, list):
                return tuple(str(v).strip() for v in parsed if str(v).strip())
        return value

    @field_validator("coscheduler_names")
    @classmethod
    def _not_the_default_scheduler(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if DEFAULT_SCHEDULER in value:
            raise ValueError(f"{DEFAULT_SCHEDULER!r} is not a coscheduler name (every pod has it)")
        return value

    @classmethod
    def from_env(cls) -> OperatorSettings:
        return cls()

    @classmethod
    def from_deployment(cls, deployment: dict[str, Any]) -> OperatorSettings:
        """The settings a quorum-operator Deployment gives its process: the plain `value`s of its
        operator container's QUORUM_OPERATOR_* variables over this process's environment
        (`quorum explain` replays a pass with the installed operator's settings)."""
        containers = ((deployment.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers")
        chosen: dict[str, str] = {}
        for container in containers or []:
            for var in container.get("env") or []:
                name, value = var.get("name"), var.get("value")
                if isinstance(name, str) and name.startswith(PREFIX) and isinstance(value, str):
                    chosen[name.removeprefix(PREFIX).lower()] = value
        known = {k: v for k, v in chosen.items() if k in cls.model_fields and k != "namespace"}
        return cls(**known)  # type: ignore[arg-type]  # strings, validated as the env would be


@dataclass(frozen=True)
class PreemptionLoopSettings:
    enabled: bool = True
    timeout_seconds: float = 180.0
    """A preemption not finished by then (the preemptor bound) is ended: taints removed."""
    retry_seconds: float = 10.0
    """A gang for which preemption found nothing to take is asked again after this long."""
    decision: PreemptionSettings = field(default_factory=PreemptionSettings)
    namespace: str = DEFAULT_NAMESPACE
    """quorum's own namespace: the platform's full record of each preemption (every name) is an
    Event there, out of tenants' reach (docs/threat-model.md, "What a tenant can read")."""


@dataclass(frozen=True)
class LoopSettings:
    planner: PlannerSettings = field(default_factory=PlannerSettings)
    resync_seconds: float = 5.0  # a pass at least this often, even without events
    release_concurrency: int = 128  # pod patches in flight at once
    gang_concurrency: int = 64  # gangs whose tasks (release, status, recovery) run at once
    gang_timeout_seconds: float = 30.0  # one gang's task is cut off after this long
    failure_backoff: BackoffPolicy = field(default_factory=lambda: BackoffPolicy(1.0, 60.0))
    label_gang_retention_seconds: float = 300.0  # label-only Gang objects outlive their pods this long
    # A gang still short of members is written (Gang object, status, Events) only once it has
    # waited this long: a gang whose pods arrive together is released before anyone needs to
    # read why it waits, and its writes would cost the apiserver for nothing.
    forming_grace_seconds: float = 2.0
    status_interval_seconds: float = 1.0  # one gang's status is written at most this often
    # After a pass that took t seconds, the next starts no sooner than factor x t later (at most
    # 1 s): events that arrive meanwhile are taken together, so a busy loop spends at most
    # 1/(1+factor) of a core on passes (0: a pass on every event, as soon as the last one ends).
    pass_gap_factor: float = 5.0
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    preemption: PreemptionLoopSettings = field(default_factory=PreemptionLoopSettings)
    member_loss_policy: MemberLossPolicy = MemberLossPolicy.REPLACE  # gangs without the annotation
    # A new leader waits at most this long for its watches to show an object listed at its
    # takeover that they do not show at all (made since, or deleted since the list); one they
    # show older is always waited for.
    catch_up_seconds: float = 30.0
    # The scheduler names quorum takes besides the default scheduler's (OperatorSettings): another
    # scheduler found running under one of them is told about (quorum.operator.schedulers).
    coscheduler_names: tuple[str, ...] = COSCHEDULER_NAMES
    placement: Placer = Placer.QUORUM  # who places gang pods (quorum.operator.delegation)


def planner_settings(config: OperatorSettings) -> PlannerSettings:
    return PlannerSettings(
        fit=FitSettings(org=config.org),
        starvation_seconds=config.starvation_seconds,
        starvation_hold_seconds=config.starvation_hold_seconds,
        starvation_rest_seconds=config.starvation_rest_seconds,
        starvation_max_share=config.starvation_max_share,
        starvation_idle_seconds=config.starvation_idle_seconds,
    )


def loop_settings(config: OperatorSettings) -> LoopSettings:
    """What the scheduling loop takes, from the operator's settings (and what `quorum explain`
    replays a pass with)."""
    return LoopSettings(
        planner=planner_settings(config),
        resync_seconds=config.resync_seconds,
        release_concurrency=config.release_concurrency,
        gang_concurrency=config.gang_concurrency,
        gang_timeout_seconds=config.gang_timeout_seconds,
        forming_grace_seconds=config.forming_grace_seconds,
        status_interval_seconds=config.status_interval_seconds,
        pass_gap_factor=config.pass_gap_factor,
        backoff=BackoffPolicy(config.backoff_seconds, config.backoff_cap_seconds),
        preemption=PreemptionLoopSettings(
            config.preemption,
            config.preemption_timeout_seconds,
            config.preemption_retry_seconds,
            namespace=config.namespace,
        ),
        member_loss_policy=config.member_loss_policy,
        coscheduler_names=config.coscheduler_names,
        placement=config.placement,
    )
