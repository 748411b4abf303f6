"""quorum-operator's own HTTP endpoint (it replaces kopf's liveness endpoint): `/healthz`,
`/readyz` and `/metrics`, on aiohttp, in the operator's event loop.

- `/healthz` (liveness): 200 `ok`, unless this replica leads and no scheduling pass has completed
  for more than `Health.liveness_seconds`: then 500 with a sentence saying so, and the kubelet
  restarts a leader whose loop is stuck. A replica that does not lead is live (it only waits for
  the Lease).
- `/readyz` (readiness): 200 once every watched kind has been listed (`Health.synced`), else 503
  naming the kinds not listed yet.
- `/metrics`: `quorum.operator.metrics.REGISTRY` in the Prometheus text format.

The scheduling loop keeps a `Health` current; `monitor_event_loop_lag` measures how late the
event loop runs (a blocked loop delays every watch, pass and probe).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from quorum.operator.metrics import CACHE_SYNCED, EVENT_LOOP_LAG, EVENT_LOOP_LAG_MAX, LEADER, REGISTRY


@dataclass
class Health:
    """What the probes answer from; the scheduling loop updates it.

    Set `leading` and `synced` through `set_leading` and `set_synced`, which keep the
    quorum_operator_leader and quorum_operator_cache_synced gauges in step (`/metrics` also
    copies both into the gauges before it answers, so a direct assignment shows there too)."""

    leading: bool = False
    """This replica holds the leader Lease and runs the scheduling passes."""
    last_pass: float = 0.0
    """`time.monotonic()` when the last scheduling pass completed; set to now when leading
    starts (`set_leading(True)`), so a new leader has `liveness_seconds` for its first pass."""
    synced: dict[str, bool] = field(default_factory=dict)
    """Watched kind (Pod, Node, PodGroup, ...) -> it has been listed (its cache is complete).
    Register every kind as False at start: readiness waits for the kinds present here only."""
    liveness_seconds: float = 60.0
    """A leader with no completed pass for longer than this is not live."""

    def __post_init__(self) -> None:
        self.export()

    def set_leading(self, leading: bool) -> None:
        """This replica became the leader (True) or stopped leading (False)."""
        if leading and not self.leading:
            self.last_pass = time.monotonic()
        self.leading = leading
        LEADER.set(1 if leading else 0)

    def pass_completed(self) -> None:
        """A scheduling pass completed now."""
        self.last_pass = time.monotonic()

    def set_synced(self, kind: str, synced: bool) -> None:
        """`kind` has been listed (True), or must be listed again (False)."""
        self.synced[kind] = synced
        CACHE_SYNCED.labels(kind).set(1 if synced else 0)

    def export(self) -> None:
        """Copy `leading` and `synced` into their gauges."""
        LEADER.set(1 if self.leading else 0)
        for kind, synced in self.synced.items():
            CACHE_SYNCED.labels(kind).set(1 if synced else 0)

    def liveness(self, now: float | None = None) -> tuple[bool, str]:
        """(live, what to say). `now`: a `time.monotonic()` value (default: now)."""
        if not self.leading:
            return True, "ok"
        age = (time.monotonic() if now is None else now) - self.last_pass
        if age > self.liveness_seconds:
            return False, (
                f"leading, but no scheduling pass completed for {age:.0f}s (limit {self.liveness_seconds:g}s)"
            )
        return True, "ok"

    def readiness(self) -> tuple[bool, str]:
        """(ready, what to say)."""
        missing = sorted(kind for kind, synced in self.synced.items() if not synced)
        if missing:
            return False, f"not listed yet: {', '.join(missing)}"
        return True, "ok"


HEALTH_KEY = web.AppKey("health", Health)
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The content type of `/metrics` (the Prometheus text format `generate_latest` writes)."""


async def healthz(http: web.Request) -> web.Response:
    live, message = http.app[HEALTH_KEY].liveness()
    return web.Response(status=200 if live else 500, text=message)


async def readyz(http: web.Request) -> web.Response:
    ready, message = http.app[HEALTH_KEY].readiness()
    return web.Response(status=200 if ready else 503, text=message)


async def metrics(http: web.Request) -> web.Response:
    http.app[HEALTH_KEY].export()
    return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE})


def make_app(health: Health) -> web.Application:
    app = web.Application()
    app[HEALTH_KEY] = health
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def serve(host: str, port: int, health: Health) -> web.AppRunner:
    """Listen on host:port (127.0.0.1, or 0.0.0.0 in a pod) and answer from `health`; returns
    the runner: `await runner.cleanup()` stops it."""
    runner = web.AppRunner(make_app(health), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_address=True).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


async def monitor_event_loop_lag(interval: float = 0.05) -> None:
    """Forever: sleep `interval`, and record how much later than that the loop woke us into
    quorum_operator_event_loop_lag_seconds and, when it is the worst so far,
    quorum_operator_event_loop_lag_max_seconds. Run it as a task; cancel it to stop."""
    # time.monotonic(), not loop.time(): uvloop's clock has millisecond steps, cached per turn.
    worst = REGISTRY.get_sample_value("quorum_operator_event_loop_lag_max_seconds") or 0.0
    while True:
        started = time.monotonic()
        await asyncio.sleep(interval)
        lag = max(0.0, time.monotonic() - started - interval)
        EVENT_LOOP_LAG.observe(lag)
        if lag > worst:
            worst = lag
            EVENT_LOOP_LAG_MAX.set(lag)
