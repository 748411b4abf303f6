"""The aiohttp application: one route per webhook, health, readiness and metrics.

The request path makes no API calls: parse the review, run the webhook's policies, build one
patch, answer. Bad input gets HTTP 400 with a short JSON error; a policy's exception gets the
webhook's failure mode (see `registry`), is logged with the request uid and counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from quorum.webhooks.metrics import CONTENT_TYPE, Metrics
from quorum.webhooks.patch import Intent, build_patch
from quorum.webhooks.registry import WEBHOOKS, OnError, Webhook
from quorum.webhooks.review import (
    AdmissionRequest,
    BadReview,
    Decision,
    error_body,
    parse_review,
    response_body,
)
from quorum.webhooks.settings import WebhookSettings

log = logging.getLogger("quorum.webhooks")


class BodyBudget:
    """Bytes of request bodies held at once, by the size each request declares (so a body is
    counted before it is read), bounded by `limit`. A request over it waits its turn (unread),
    for a while."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.freed = asyncio.Condition()

    async def take(self, size: int, seconds: float) -> bool:
        """Hold `size` bytes, waiting at most `seconds` for them; False if they were not free."""
        if size == 0:
            return True
        if size > self.limit:
            return False
        try:
            async with asyncio.timeout(seconds), self.freed:
                await self.freed.wait_for(lambda: self.held + size <= self.limit)
                self.held += size
                return True
        except TimeoutError:
            return False

    async def give(self, size: int) -> None:
        if size:
            async with self.freed:
                self.held -= size
                self.freed.notify_all()


METRICS_KEY = web.AppKey("metrics", Metrics)
READY_KEY = web.AppKey("ready", list)
BUDGET_KEY = web.AppKey("budget", BodyBudget)
# For the AppRunner: the apiserver sends reviews unencoded, so a body is never decompressed (no
# gzip bomb is unpacked; `_read_body` refuses any Content-Encoding).
RUNNER_OPTIONS: dict[str, Any] = {"auto_decompress": False}


def evaluate(webhook: Webhook, request: AdmissionRequest, settings: WebhookSettings) -> Decision:
    """Run every policy of a webhook; the first denial wins, warnings and intents add up."""
    warnings: list[str] = []
    intents: list[Intent] = []
    for policy in webhook.policies:
        decision = policy(request, settings)
        if not decision.allowed:
            decision.warnings = warnings + decision.warnings
            return decision
        warnings += decision.warnings
        intents += decision.intents
    return Decision(intents=intents, warnings=warnings)


async def _read_body(request: web.Request, limit: int, seconds: float) -> bytes:
    encoding = request.headers.get("Content-Encoding", "identity")
    if encoding.lower() != "identity":
        raise BadReview(f"Content-Encoding {encoding[:40]!r} is not accepted: send the review as plain JSON")
    if request.content_length is not None and request.content_length > limit:
        raise BadReview(f"body of {request.content_length} bytes is over the limit of {limit}")
    try:
        async with asyncio.timeout(seconds):
            return await request.read()  # aiohttp stops at client_max_size (== limit)
    except TimeoutError:
        raise BadReview(f"body not received whole within {seconds:g}s") from None
    except web.HTTPRequestEntityTooLarge:
        raise BadReview(f"body is over the limit of {limit} bytes") from None
    except RequestPayloadError as err:  # broken chunked framing, say
        raise BadReview(f"body could not be read: {' '.join(str(err).split())}") from None
    except ConnectionResetError:  # nobody will read the answer; only end the request quietly
        raise BadReview("the client hung up before the end of its body") from None


def answer(webhook: Webhook, settings: WebhookSettings, metrics: Metrics, body: bytes) -> tuple[int, bytes]:
    """(HTTP status, body) for one AdmissionReview body. Never raises."""
    started = time.perf_counter()
    counts = metrics.webhook(webhook.name)
    try:
        review = parse_review(body)
        if review.kind not in webhook.kinds:
            raise BadReview(
                f"webhook {webhook.name} reviews {', '.join(sorted(webhook.kinds))}, not {review.kind}"
            )
    except BadReview as err:
        counts.observe("bad_request", time.perf_counter() - started)
        return 400, error_body(str(err))
    patch = None
    try:
        decision = evaluate(webhook, review, settings)
        if webhook.mutating and decision.allowed and decision.intents and review.object is not None:
            patch = build_patch(review.object, decision.intents)
        result = "allowed" if decision.allowed else "denied"
    except Exception:
        log.exception(
            "policy error in %s, request uid %s; answering %s",
            webhook.name,
            review.uid,
            webhook.on_error.value,
        )
        counts.errors.inc()
        result, patch = "error", None
        if webhook.on_error is OnError.ALLOW:
            decision = Decision(warnings=[f"quorum: {webhook.name} failed; admitted unchanged"])
        else:
            decision = Decision(
                denied=f"quorum: {webhook.name} could not review this request (uid {review.uid}); try again",
                code=500,
            )
    if patch:
        counts.mutations.inc()
    counts.observe(result, time.perf_counter() - started)
    return 200, response_body(review.uid, decision, patch)


def unread(response: web.Response) -> web.Response:
    """A response to a request whose body was not read whole: the connection is closed after it,
    not kept to read (and hold) the rest of that body."""
    response.force_close()
    return response


def review_handler(
    webhook: Webhook, settings: WebhookSettings, metrics: Metrics
) -> Callable[[web.Request], Awaitable[web.Response]]:
    counts = metrics.webhook(webhook.name)  # its series exist from the start, at 0

    async def handle(http: web.Request) -> web.Response:
        budget = http.app[BUDGET_KEY]
        declared = http.content_length
        size = min(declared, settings.max_body_bytes) if declared is not None else settings.max_body_bytes
        if size <= settings.small_body_bytes:
            size = 0  # small: never crowded out by large ones
        if not await budget.take(size, settings.body_seconds):
            counts.observe("busy", 0.0)
            message = f"quorum-webhooks is reading {budget.held} bytes of reviews already; try again"
            return unread(web.Response(status=503, body=error_body(message), content_type="application/json"))
        try:
            try:
                body = await _read_body(http, settings.max_body_bytes, settings.body_seconds)
            except BadReview as err:
                counts.observe("bad_request", 0.0)
                return unread(
                    web.Response(status=400, body=error_body(str(err)), content_type="application/json")
                )
            status, payload = answer(webhook, settings, metrics, body)
            return web.Response(status=status, body=payload, content_type="application/json")
        finally:
            await budget.give(size)

    return handle


async def healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def readyz(http: web.Request) -> web.Response:
    ready = bool(http.app[READY_KEY])
    return web.Response(status=200 if ready else 503, text="ok" if ready else "starting")


async def metrics_handler(http: web.Request) -> web.Response:
    return web.Response(body=http.app[METRICS_KEY].render(), headers={"Content-Type": CONTENT_TYPE})


def make_app(
    settings: WebhookSettings, metrics: Metrics | None = None, webhooks: tuple[Webhook, ...] = WEBHOOKS
) -> web.Application:
    # Bodies over the limit get our HTTP 400 with a message (see _read_body), not a 413.
    app = web.Application(client_max_size=settings.max_body_bytes)
    app[BUDGET_KEY] = BodyBudget(settings.bodies_in_flight_bytes)
    app[METRICS_KEY] = metrics or Metrics()
    app[READY_KEY] = []
    for webhook in webhooks:
        app.router.add_post(webhook.path, review_handler(webhook, settings, app[METRICS_KEY]))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    return app
