"""Settings of quorum-webhooks: one pydantic object, read from a file and the environment.

Sources, later ones win: the defaults below; the YAML or JSON file named by
`QUORUM_WEBHOOKS_CONFIG`; environment variables `QUORUM_WEBHOOKS_<FIELD>` (upper-case field
name; lists and objects as JSON, e.g. `QUORUM_WEBHOOKS_PLATFORM_USERS='["a","b"]'`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from quorum.core.gangs import (
    COSCHEDULER_NAMES,
    DEFAULT_SCHEDULER,
    Placer,
    quorum_schedulers,
    volcano_dialect,
)
from quorum.install import DEFAULT_NAMESPACE, operator_username

ENV_PREFIX = "QUORUM_WEBHOOKS_"
CONFIG_ENV = "QUORUM_WEBHOOKS_CONFIG"


class InterruptableOnGang(StrEnum):
    WARN = "warn"
    DENY = "deny"


class Toleration(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    key: str
    operator: str = "Exists"
    value: str | None = None
    effect: str | None = "NoSchedule"

    def as_dict(self) -> dict[str, str]:
        return self.model_dump(exclude_none=True)


class WebhookSettings(BaseModel):
    """Everything the policies and the server are configured by."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # -- CPU toleration ---------------------------------------------------------------------
    accelerator_resources: tuple[str, ...] = ("nvidia.com/gpu", "sunk.coreweave.com/accelerator")
    """Extended resources that make a pod accelerated (it then gets no CPU toleration)."""
    resource_claims_are_accelerated: bool = True
    """A pod with DRA `resourceClaims` is treated as accelerated (DRA GPUs carry no resource
    name the webhook could see)."""
    cpu_toleration: Toleration = Toleration(key="is_cpu_compute")

    # -- reserved label domains -------------------------------------------------------------
    reserved_label_domains: tuple[str, ...] = ("coreweave.cloud", "coreweave.com")
    user_settable_labels: tuple[str, ...] = ("qos.coreweave.cloud/interruptable",)
    platform_users: tuple[str, ...] = ("quorum:node-lifecycle",)
    """Identities that own the reserved domains (the platform's node lifecycle, ...)."""
    platform_groups: tuple[str, ...] = ()
    """Groups exempt from the reserved domains. `system:masters` is not in it by default."""

    # -- interruptable label ----------------------------------------------------------------
    interruptable_label: str = "qos.coreweave.cloud/interruptable"
    interruptable_on_gang: InterruptableOnGang = InterruptableOnGang.WARN

    # -- DaemonSets on SUNK nodes -----------------------------------------------------------
    sunk_daemonset_warnings: bool = True
    """Warn when a DaemonSet that can run on SUNK (Slurm) nodes lacks their tolerations."""
    sunk_node_label: str = "quorum.dev/slurm-node"
    """The node label SUNK nodes carry as "true"; a DaemonSet that rules it out is not warned."""
    sunk_reserved_value: str | None = None
    """The org's value of the `node.coreweave.cloud/reserved` taint; None: any value will do."""

    # -- gangs ------------------------------------------------------------------------------
    coscheduler_names: tuple[str, ...] = COSCHEDULER_NAMES
    """Scheduler names quorum takes: rewritten to `default_scheduler` (the original goes to
    quorum.dev/requested-scheduler). With the default scheduler's and none, these are quorum's
    schedulers; a pod asking for any other is not quorum's. The install renders the same list
    into the operator's settings and the policies' CEL (chart values `schedulers`)."""
    default_scheduler: str = DEFAULT_SCHEDULER
    placement: Placer = Placer.QUORUM
    """Who places gang pods (docs/placement.md): `quorum`, each held at quorum's gate; or
    `kube-scheduler`, each made to name a Kubernetes PodGroup (`spec.schedulingGroup`) for
    kube-scheduler's gang cycle. The install renders the same value into the operator's settings
    and the policies' CEL (chart value `placement`)."""
    operator_users: tuple[str, ...] = (operator_username(DEFAULT_NAMESPACE),)
    """quorum's own identity: the only one that may change quorum.dev/* labels on a pod (the
    manifests set it for the namespace quorum is installed in)."""

    # -- server -----------------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = Field(default=8443, ge=0, le=65535)
    cert_file: Path | None = None
    key_file: Path | None = None
    cert_reload_seconds: float = Field(default=5.0, gt=0)
    max_body_bytes: int = Field(default=3 * 1024 * 1024, gt=0)
    """Larger AdmissionReviews are refused (the apiserver's own object limit is ~3 MiB)."""
    body_seconds: float = Field(default=3.0, gt=0)
    """A request body not received whole within this long is refused (the apiserver sends a
    review at once, and waits no longer than the webhooks' timeoutSeconds, 3 s, for the answer):
    a client that trickles its body holds memory this long at most."""
    bodies_in_flight_bytes: int = Field(default=96 * 1024 * 1024, gt=0)
    """Large request bodies (over `small_body_bytes`) being read and answered at once, in bytes
    by their Content-Length (`max_body_bytes` without one); beyond it a large request waits its
    turn, unread, for up to `body_seconds`, then is answered 503. It bounds what large or slow
    bodies hold: 96 MiB, in a 256 MiB limit."""
    small_body_bytes: int = Field(default=64 * 1024, gt=0)
    """Bodies up to this size (nearly every review the apiserver sends) are never refused for the
    budget above: large ones cannot crowd them out."""

    @property
    def quorum_scheduler_names(self) -> tuple[str, ...]:
        """Pods asking for one of these schedulers are quorum's; any other scheduler's are not."""
        return quorum_schedulers(self.coscheduler_names, self.default_scheduler)

    @property
    def volcano_dialect(self) -> bool:
        """The group annotation scheduling.k8s.io/group-name marks gang pods (`volcano` is taken)."""
        return volcano_dialect(self.coscheduler_names)

    @field_validator("coscheduler_names")
    @classmethod
    def _not_the_default_scheduler(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if "" in value or DEFAULT_SCHEDULER in value:
            raise ValueError(
                f"coscheduler_names may not hold {DEFAULT_SCHEDULER!r} or '' (every pod has one)"
            )
        return value

    @field_validator("reserved_label_domains")
    @classmethod
    def _domains_are_lower_case(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(d.lower().strip(".") for d in value)


class SettingsError(ValueError):
    pass


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> WebhookSettings:
    """Settings from `QUORUM_WEBHOOKS_CONFIG`, then `QUORUM_WEBHOOKS_*`, then `overrides`."""
    env = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    if path := env.get(CONFIG_ENV):
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise SettingsError(f"cannot read {CONFIG_ENV}={path}: {err}") from err
        if not isinstance(loaded, dict):
            raise SettingsError(f"{path} must hold a mapping of settings, not {type(loaded).__name__}")
        data.update(loaded)
    fields = WebhookSettings.model_fields
    for key, raw in env.items():
        if not key.startswith(ENV_PREFIX) or key == CONFIG_ENV:
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name not in fields:
            raise SettingsError(
                f"{key} is not a setting; known: " + ", ".join(ENV_PREFIX + f.upper() for f in fields)
            )
        try:
            data[name] = json.loads(raw)
        except json.JSONDecodeError:
            data[name] = raw  # a plain string
    data.update(overrides)
    try:
        return WebhookSettings.model_validate(data)
    except ValidationError as err:
        raise SettingsError(f"invalid webhook settings: {err}") from err
