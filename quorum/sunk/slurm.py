"""A small typed client of slurmrestd's OpenAPI v0.0.38 (Slurm 22.05): submit, list, read and
cancel jobs, list nodes. Written here rather than generated: the official generated clients are
for v0.0.39+ (Slurm 23.02+), and the scheduler needs five calls.

Authentication is Slurm's JWT: an HS256 token over `{"sun": user, "iat", "exp"}` signed with the
cluster's `jwt_key` (what `scontrol token` makes), sent as X-SLURM-USER-NAME/-TOKEN. Every call
has a time limit; a slurmrestd that hangs costs one call its limit, never the scheduler's loop.

Node state changes (drain, resume) have no endpoint before v0.0.39; `scontrol` does them
(`drain_node`, `resume_node`), the one thing the scheduler runs as a command.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import jwt
import orjson
from pydantic import BaseModel, ConfigDict, Field

from quorum.sunk.model import NodeShare, gpus_of_gres

API = "/slurm/v0.0.38"
TOKEN_SECONDS = 600


class SlurmError(RuntimeError):
    """slurmrestd answered with an error, or not at all."""


class SlurmUnavailable(SlurmError):
    """No answer from Slurm about the request itself: slurmrestd unreachable or timed out, an
    answer that is not slurmrestd's, or slurmctld out of reach behind it. The request may or may
    not have been carried out; ask again later (a pass reads every job before it submits)."""


# Slurm's errno ranges that mean "could not talk to the controller", not "the controller said
# no" (slurm/slurm_errno.h): communication and protocol, slurmctld communication, sockets; and
# EINTR, EAGAIN ("temporarily unable to accept job"), ETIMEDOUT.
TRANSIENT_ERRNOS = frozenset({4, 11, 110, *range(1000, 1100), *range(1800, 1900), *range(5000, 5100)})


class JobResourcesNode(BaseModel):
    model_config = ConfigDict(extra="ignore")
    nodename: str
    sockets: dict[str, Any] = {}


class JobResources(BaseModel):
    model_config = ConfigDict(extra="ignore")
    nodes: str = ""
    allocated_nodes: list[JobResourcesNode] = []


class Job(BaseModel):
    """The fields of a v0.0.38 job the scheduler reads."""

    model_config = ConfigDict(extra="ignore")
    job_id: int
    job_state: str = ""
    state_reason: str | None = None
    comment: str | None = None
    nodes: str | None = None
    partition: str | None = None
    het_job_id: int = 0
    het_job_offset: int = 0
    gres_detail: list[str] = []
    job_resources: JobResources | None = None
    user_name: str | None = None
    end_time: int | None = None
    preempt_time: int | None = None

    @property
    def alive(self) -> bool:
        """Pending or holding (part of) an allocation."""
        return self.job_state in ("PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED", "RESIZING")

    @property
    def group_id(self) -> int:
        """The id a heterogeneous job's components share (its own id otherwise)."""
        return self.het_job_id or self.job_id

    def shares(self) -> list[NodeShare]:
        """What each node of the allocation gave this job (CPUs from its allocated cores, GPUs
        from gres_detail, which lists the nodes in the same order)."""
        resources = self.job_resources
        if resources is None:
            return []
        found = []
        for i, node in enumerate(resources.allocated_nodes):
            cores = sum(
                1
                for socket in node.sockets.values()
                for state in (socket.get("cores") or {}).values()
                if str(state).startswith("allocated")
            )
            gpus = gpus_of_gres(self.gres_detail[i]) if i < len(self.gres_detail) else 0
            found.append(NodeShare(node.nodename, cores, gpus))
        return found


class Node(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    state: str = ""
    state_flags: list[str] = Field(default_factory=list)
    reason: str | None = None


def make_token(key: bytes, user: str, now: float | None = None, seconds: int = TOKEN_SECONDS) -> str:
    issued = int(now if now is not None else time.time())
    return jwt.encode({"sun": user, "iat": issued, "exp": issued + seconds}, key, algorithm="HS256")


class Slurm(Protocol):
    """What the scheduler asks of Slurm; `SlurmRest` is the real one, unit tests pass a
    stateful fake."""

    async def submit(self, body: Mapping[str, Any]) -> int: ...

    async def jobs(self) -> list[Job]: ...

    async def job(self, job_id: int) -> list[Job]: ...

    async def cancel(self, job_id: int) -> None: ...

    async def nodes(self) -> list[Node]: ...


class SlurmRest:
    """slurmrestd at `url`, as `user`, with tokens signed by `key`."""

    def __init__(self, url: str, key: bytes, user: str = "root", timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.key = key
        self.user = user
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._token: tuple[float, str] | None = None

    @classmethod
    def from_key_file(cls, url: str, key_file: Path, user: str = "root") -> SlurmRest:
        return cls(url, key_file.read_bytes(), user)

    def _headers(self) -> dict[str, str]:
        now = time.time()
        if self._token is None or self._token[0] < now + 60:
            self._token = (now + TOKEN_SECONDS, make_token(self.key, self.user, now))
        return {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self._token[1]}

    async def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout, trust_env=False)
        data = orjson.dumps(body) if body is not None else None
        headers = {**self._headers(), **({"Content-Type": "application/json"} if data else {})}
        try:
            async with self._session.request(method, self.url + API + path, data=data, headers=headers) as r:
                raw = await r.read()
                status = r.status
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            raise SlurmUnavailable(f"slurmrestd {method} {path}: {type(err).__name__}: {err}") from None
        return answer_of(method, path, status, raw)

    async def ping(self) -> bool:
        answer = await self._call("GET", "/ping")
        return any(p.get("ping") == "UP" for p in answer.get("pings") or [])

    async def submit(self, body: Mapping[str, Any]) -> int:
        answer = await self._call("POST", "/job/submit", body)
        return int(answer["job_id"])

    async def jobs(self) -> list[Job]:
        answer = await self._call("GET", "/jobs")
        return [Job.model_validate(j) for j in answer.get("jobs") or []]

    async def job(self, job_id: int) -> list[Job]:
        """The job (every component of a heterogeneous one); [] if Slurm no longer knows it."""
        try:
            answer = await self._call("GET", f"/job/{int(job_id)}")
        except SlurmError as err:
            if "Invalid job id" in str(err) or "HTTP 404" in str(err):
                return []
            raise
        return [Job.model_validate(j) for j in answer.get("jobs") or []]

    async def cancel(self, job_id: int) -> None:
        """Cancel a job (SIGTERM now, SIGKILL after KillWait); a job already ended is fine."""
        try:
            await self._call("DELETE", f"/job/{int(job_id)}")
        except SlurmError as err:
            if "already completing or completed" in str(err).lower() or "Invalid job id" in str(err):
                return
            raise

    async def nodes(self) -> list[Node]:
        answer = await self._call("GET", "/nodes")
        return [Node.model_validate(n) for n in answer.get("nodes") or []]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def answer_of(method: str, path: str, status: int, raw: bytes) -> dict[str, Any]:
    """slurmrestd's answer, or the error it carries: `SlurmUnavailable` when it is not Slurm
    refusing the request (see `TRANSIENT_ERRNOS`), `SlurmError` when it is."""
    where = f"slurmrestd {method} {path}: HTTP {status}"
    try:
        answer = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        raise SlurmUnavailable(f"{where}, not JSON: {raw[:200]!r}") from None
    if not isinstance(answer, dict):
        raise SlurmUnavailable(f"{where}, not an object: {raw[:200]!r}")
    listed = answer.get("errors")
    errors = [
        e for e in (listed if isinstance(listed, list) else [])
        if isinstance(e, dict) and (e.get("error_number") or e.get("error"))
    ]  # fmt: skip
    if status < 400 and not errors:
        return answer
    text = "; ".join(str(e.get("error") or e.get("description") or e) for e in errors) or repr(raw[:200])
    numbers = {n for e in errors if isinstance(n := e.get("error_number"), int)}
    if (not errors and status >= 500) or numbers & TRANSIENT_ERRNOS:
        raise SlurmUnavailable(f"{where}: {text}")
    raise SlurmError(f"{where}: {text}")


async def scontrol(*args: str, timeout: float = 15.0) -> tuple[int, str]:
    """Run `scontrol` with SLURM_CONF from the environment; (exit code, output)."""
    proc = await asyncio.create_subprocess_exec(
        "scontrol", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if k != "SLURM_JWT"},
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return 124, f"scontrol {' '.join(args)} timed out after {timeout:.0f}s"
    return proc.returncode or 0, out.decode(errors="replace").strip()


async def drain_node(node: str, reason: str) -> tuple[int, str]:
    return await scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason[:200]}")


async def resume_node(node: str) -> tuple[int, str]:
    return await scontrol("update", f"NodeName={node}", "State=RESUME")
