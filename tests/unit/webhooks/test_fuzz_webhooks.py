"""A small run of the fuzzer (`make bench-fuzz` sends 100,000 cases to the real process): a
few thousand hostile reviews, from every category, through the in-process server over HTTP."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
from aiohttp.test_utils import TestServer

from quorum.webhooks.metrics import Metrics
from quorum.webhooks.server import RUNNER_OPTIONS, make_app
from quorum.webhooks.settings import WebhookSettings
from tests.bench import fuzz_webhooks as fuzz

LIMIT = 256 * 1024  # a smaller body limit keeps the oversize and volume cases quick
CASES = 5000


async def test_a_few_thousand_hostile_reviews_get_no_5xx_and_every_check_holds() -> None:
    metrics = Metrics()
    server = TestServer(make_app(WebhookSettings(max_body_bytes=LIMIT), metrics))
    await server.start_server(**RUNNER_OPTIONS)
    try:
        tally = await fuzz.run_cases(
            f"http://127.0.0.1:{server.port}", None, range(CASES), seed=14, limit=LIMIT
        )
    finally:
        await server.close()
    assert sum(tally.sent.values()) == CASES
    assert set(tally.sent) == set(fuzz.CATEGORIES), "every category ran"
    assert tally.totals().get("5xx", 0) == 0
    assert tally.failure_count == 0, tally.failures[:5]
    assert tally.totals()["2xx"] > CASES // 3 and tally.totals()["4xx"] > CASES // 5
    errors = [
        w for w in metrics.render().decode().splitlines() if w.startswith("quorum_webhook_policy_errors")
    ]
    assert all(line.endswith(" 0") for line in errors), errors


def test_cases_are_reproducible_and_cover_every_path() -> None:
    first = [fuzz.case(7, i, LIMIT) for i in range(400)]
    again = [fuzz.case(7, i, LIMIT) for i in range(400)]
    assert [(c.category, c.path, c.body, c.raw) for c in first] == [
        (c.category, c.path, c.body, c.raw) for c in again
    ]
    assert {c.path for c in first} >= set(fuzz.PATHS)


def test_the_checker_catches_what_it_is_there_to_catch() -> None:
    """The checks can fail: a 500, a wrong uid, a policy error, a 200 for a review without uid."""
    review = fuzz.Case(
        "mutation", "/mutate/pods", fuzz.serialize(fuzz.envelope("Pod", {}, uid="u-1")), frozenset({200})
    )
    no_uid = fuzz.Case(
        "envelope", "/mutate/pods", fuzz.serialize(fuzz.envelope("Pod", {}, uid=5)), frozenset({200, 400})
    )

    def answer(uid: Any, **response: Any) -> bytes:
        return orjson.dumps({"response": {"uid": uid, "allowed": True, **response}})

    assert fuzz.check(review, 200, answer("u-1")) == []
    assert "HTTP 500" in fuzz.check(review, 500, b"")
    assert any("uid" in p for p in fuzz.check(review, 200, answer("u-2")))
    assert any(
        "policy error" in p
        for p in fuzz.check(review, 200, answer("u-1", warnings=["quorum: x failed; admitted unchanged"]))
    )
    assert any(
        "policy error" in p
        for p in fuzz.check(review, 200, answer("u-1", allowed=False, status={"code": 500}))
    )
    assert any("without a non-empty string uid" in p for p in fuzz.check(no_uid, 200, answer(5)))
    assert any("400 body is not JSON" in p for p in fuzz.check(no_uid, 400, b"<html>"))
    counts = Counter(fuzz.case(1, i).category for i in range(2000))
    assert counts["mutation"] > counts["volume"] > 0
