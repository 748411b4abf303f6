"""Settings of quorum-sunk-scheduler, from QUORUM_SUNK_* environment variables."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from quorum.sunk.model import ANY_NAMESPACE, Allowance

_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SLURM_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_ALLOWANCE_KEYS = ("partitions", "accounts", "qos", "reservations")


class SunkSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QUORUM_SUNK_", frozen=True)

    scheduler_name: str = Field(default="tenant-slurm-slurm-scheduler", min_length=1, max_length=253)
    """The `spec.schedulerName` of the pods this scheduler takes."""
    slurm_url: str = "http://127.0.0.1:6820"
    """slurmrestd (OpenAPI v0.0.38)."""
    slurm_jwt_key_file: Path = Path("/etc/slurm/jwt_hs256.key")
    """Slurm's `AuthAltParameters=jwt_key=` file: the scheduler signs its tokens with it."""
    slurm_user: str = "root"
    """The Slurm user placeholder jobs run as (a user that may submit to every partition used)."""
    slurm_kill_wait_seconds: int = Field(default=30, ge=6, le=3600)
    """Slurm's KillWait: pods' terminationGracePeriodSeconds must be below it minus 5 s."""
    hook_url: str = "http://127.0.0.1:8091"
    """Where the prolog, epilog and placeholder script reach the hook API (a Service in a cluster)."""
    hook_token_file: Path = Path("/etc/quorum-sunk/hook.token")
    """The hook API's shared secret: callers send `Authorization: Bearer <its content>`. The
    hooks taint nodes and delete pods, so the scheduler does not start without it."""
    slurm_hook_token_path: Path = Path("/etc/slurm/quorum-hook.token")
    """Where the same secret is on the Slurm nodes (root only): the placeholder script reads it."""
    poll_seconds: float = Field(default=1.0, gt=0, le=60)
    """How often Slurm's jobs are listed (slurmrestd has no watch)."""
    lock_timeout_seconds: float = Field(default=100.0, gt=0, le=3600)
    """How long a prolog waits for the pods a lock evicts before it fails (Slurm then drains)."""
    namespaces: dict[str, Allowance] = Field(default_factory=dict)
    """What each namespace's pods may name in Slurm, as JSON: {"team-a": {"partitions": ["gpu"],
    "accounts": ["team-a"], "qos": ["normal"], "reservations": []}, "*": {...}}. A namespace's
    own entry, else "*", else nothing: a pod may always leave a kind to Slurm's default, and
    one that names a partition, account, QOS or reservation its namespace may not use is not
    submitted (Event `SlurmNotAllowed`). Every job runs as `slurm_user`, so this list, not
    Slurm, decides which of that user's partitions and accounts a tenant gets."""

    @field_validator("namespaces", mode="before")
    @classmethod
    def _allow_list(cls, value: Any) -> Any:
        """Namespace names (or "*") and Slurm names only, and no key but the four: a typo
        ("partition") must stop the scheduler, not silently allow nothing."""
        if not isinstance(value, dict):
            return value  # pydantic says what is wrong
        for namespace, entry in value.items():
            if namespace != ANY_NAMESPACE and not _NAMESPACE.fullmatch(str(namespace)):
                raise ValueError(f"{namespace!r} is not a namespace name (nor '*', every other namespace)")
            if isinstance(entry, Allowance):
                continue
            if not isinstance(entry, dict):
                raise ValueError(f"{namespace}: expected an object with keys {', '.join(_ALLOWANCE_KEYS)}")
            if unknown := sorted(set(entry) - set(_ALLOWANCE_KEYS)):
                keys = ", ".join(_ALLOWANCE_KEYS)
                raise ValueError(f"{namespace}: unknown key(s) {', '.join(unknown)}; the keys are {keys}")
            for kind, names in entry.items():
                if not isinstance(names, list) or not all(
                    isinstance(n, str) and _SLURM_NAME.fullmatch(n) for n in names
                ):
                    raise ValueError(
                        f"{namespace}.{kind}: expected a list of Slurm names (letters, digits, _ . -), "
                        f"got {names!r}"
                    )
        return value

    @property
    def stop_seconds(self) -> int:
        """How long the placeholder script waits for its pods after SIGTERM: KillWait minus 5 s,
        so the node can still be drained before Slurm kills the script."""
        return self.slurm_kill_wait_seconds - 5
