"""The hook API the Slurm side calls (an aiohttp app on the scheduler's hook port):

- `POST /hooks/prolog?job=&node=`: lock the node for the job (taint, wait for evictions); a
  non-2xx answer fails the prolog, and Slurm requeues the job and drains the node.
- `POST /hooks/epilog?job=&node=`: unlock the node unless another job still runs there.
- `POST /hooks/stop?job=`: the placeholder job was told to stop: delete the pods bound to it and
  answer once they are gone (504 if they are not, before the script's time runs out: it then
  drains the node).
- `GET /healthz`, `GET /readyz` (watches listed and a pass made), `GET /metrics` (on the metrics
  port instead when the process has one: `make_metrics_app`).

The hooks taint nodes and delete pods, so they answer only callers that send the shared secret
(`Authorization: Bearer`, 401 otherwise); the prolog and epilog only for a node the job was
given, and the stop only for a job of quorum's that Slurm is ending (403, or 404 for a job Slurm
does not know): a stolen secret still cannot lock a node no job of Slurm's runs on, nor delete
the pods of a job that runs.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable

import prometheus_client
from aiohttp import web

from quorum.sunk.model import StopRefusal
from quorum.sunk.scheduler import SunkScheduler
from quorum.sunk.slurm import SlurmError

log = logging.getLogger("quorum.sunk.hooks")
SCHEDULER: web.AppKey[SunkScheduler] = web.AppKey("scheduler", SunkScheduler)
TOKEN: web.AppKey[bytes] = web.AppKey("token", bytes)
HOOKS = prometheus_client.Counter(
    "quorum_sunk_hooks_total", "Hook API calls by hook and result", ["hook", "result"]
)


def _job(request: web.Request) -> int:
    try:
        return int(request.query["job"])
    except (KeyError, ValueError):
        raise web.HTTPBadRequest(text="job= (a Slurm job id) is required\n") from None


def _node(request: web.Request) -> str:
    node = request.query.get("node", "")
    if not node or len(node) > 253:
        raise web.HTTPBadRequest(text="node= (a Slurm node name) is required\n")
    return node


@web.middleware
async def authenticated(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """/hooks/* only with the shared secret; the probes and /metrics for anyone."""
    if request.path.startswith("/hooks/"):
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), request.app[TOKEN]):
            hook = request.path.removeprefix("/hooks/")
            HOOKS.labels(hook if hook in ("prolog", "epilog", "stop") else "other", "unauthenticated").inc()
            log.warning("hook %s refused: no valid token (from %s)", request.path, request.remote)
            raise web.HTTPUnauthorized(
                text="hook calls need `Authorization: Bearer <the token in QUORUM_SUNK_HOOK_TOKEN_FILE>`\n"
            )
    return await handler(request)


async def _node_hook(request: web.Request, hook: str) -> web.Response:
    """The prolog locks the node for the job, the epilog unlocks it; 503 fails the script; 403 is
    a call for a node the job was not given (or a job still running, to the epilog)."""
    job, node = _job(request), _node(request)
    scheduler = request.app[SCHEDULER]
    try:
        refused = await scheduler.not_the_jobs_node(job, node, ended=hook == "epilog")
        if refused is not None:
            HOOKS.labels(hook, "forbidden").inc()
            log.warning("%s job %s node %s refused: %s", hook, job, node, refused)
            return web.Response(status=403, text=refused + "\n")
        ok, message = await (scheduler.lock if hook == "prolog" else scheduler.unlock)(job, node)
    except SlurmError as err:
        ok, message = False, str(err)
    HOOKS.labels(hook, "ok" if ok else "failed").inc()
    log.info("%s job %s node %s: %s", hook, job, node, message)
    return web.Response(status=200 if ok else 503, text=message + "\n")


async def prolog(request: web.Request) -> web.Response:
    return await _node_hook(request, "prolog")


async def epilog(request: web.Request) -> web.Response:
    return await _node_hook(request, "epilog")


async def stop(request: web.Request) -> web.Response:
    job = _job(request)
    try:
        gone = await request.app[SCHEDULER].stop_job(job)
    except SlurmError as err:
        HOOKS.labels("stop", "failed").inc()
        return web.Response(status=503, text=f"{err}\n")
    if isinstance(gone, StopRefusal):
        HOOKS.labels("stop", "forbidden").inc()
        log.warning("stop job %s refused: %s", job, gone.reason)
        return web.Response(status=gone.status, text=gone.reason + "\n")
    HOOKS.labels("stop", "gone" if gone else "timeout").inc()
    log.info("stop job %s: pods %s", job, "gone" if gone else "still there")
    return web.Response(
        status=200 if gone else 504, text=("pods gone" if gone else "pods still there") + "\n"
    )


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    scheduler = request.app[SCHEDULER]
    ready = scheduler.pods_synced.is_set() and scheduler.nodes_synced.is_set() and scheduler.passes > 0
    text = "ready" if ready else "starting"
    if scheduler.last_error:
        text += f"; last pass: {scheduler.last_error}"
    return web.Response(status=200 if ready else 503, text=text + "\n")


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=prometheus_client.generate_latest(), content_type="text/plain")


def make_app(scheduler: SunkScheduler, token: str, with_metrics: bool = True) -> web.Application:
    """The hook API; `/metrics` too unless a metrics port of its own serves it (then the hook
    port, open to the Slurm nodes, and the metrics port, open to scrapers, are kept apart)."""
    app = web.Application(middlewares=[authenticated])
    app[SCHEDULER] = scheduler
    app[TOKEN] = token.encode()
    app.router.add_post("/hooks/prolog", prolog)
    app.router.add_post("/hooks/epilog", epilog)
    app.router.add_post("/hooks/stop", stop)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if with_metrics:
        app.router.add_get("/metrics", metrics)
    return app


def make_metrics_app(scheduler: SunkScheduler) -> web.Application:
    """The metrics port: `/metrics` and the probes, no hook."""
    app = web.Application()
    app[SCHEDULER] = scheduler
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
