"""Settings of quorum-sunk-scheduler, from QUORUM_SUNK_* environment variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


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

    @property
    def stop_seconds(self) -> int:
        """How long the placeholder script waits for its pods after SIGTERM: KillWait minus 5 s,
        so the node can still be drained before Slurm kills the script."""
        return self.slurm_kill_wait_seconds - 5
