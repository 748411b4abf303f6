"""Each gang's work in its own task, so that one gang's trouble stays that gang's.

A pass decides; what it decided for a gang (release it, write its status, recover it) runs as
that gang's task: at most one at a time per gang, a bounded number at once, each with a time
limit. A gang with a task in flight is left out of the next passes until the task ends (its
pods' reservations stay in the ledger meanwhile). A task that raises or times out cancels
nothing else: the error is kept as the gang's failure (shown as `PlanningFailed` with the error
in a sentence, and a Warning Event), and the gang is left alone for a backoff that doubles with
each failure in a row. The next success of the same stage clears it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.core.lifecycle import BackoffPolicy
from quorum.operator import clock

log = logging.getLogger("quorum.operator")
GangKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Failure:
    stage: str  # assemble | plan | release | status | recover | preempt
    message: str  # the error in a sentence
    count: int  # failures in a row
    delay: float  # seconds of backoff
    until: float  # monotonic: no new work for the gang before this (but its status)

    def sentence(self) -> str:
        return (
            f"{self.stage} failed ({self.count} in a row): {self.message}; "
            f"retried after a {self.delay:.0f}s backoff"
        )


def describe(err: BaseException, timeout: float | None = None) -> str:
    """An exception as a sentence a person can act on."""
    if isinstance(err, ApiException):
        body = err.body.decode(errors="replace") if isinstance(err.body, bytes) else str(err.body or "")
        try:
            message = orjson.loads(body).get("message") or body
        except (orjson.JSONDecodeError, AttributeError):
            message = body
        return f"the apiserver answered {err.status} {err.reason}: {str(message)[:300]}".rstrip(": ")
    if isinstance(err, TimeoutError):
        return f"timed out after {timeout:.0f}s" if timeout else "timed out"
    return f"{type(err).__name__}: {str(err)[:300]}"


class GangWork:
    def __init__(
        self,
        concurrency: int,
        timeout_seconds: float,
        backoff: BackoffPolicy,
        on_done: Callable[[], None],
        on_failure: Callable[[GangKey, Failure], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        self.gate = asyncio.Semaphore(concurrency)
        self.timeout = timeout_seconds
        self.backoff = backoff
        self.on_done = on_done
        self.on_failure = on_failure
        self.tasks: dict[GangKey, asyncio.Task[None]] = {}  # the gang's latest task
        self.running: set[asyncio.Task[None]] = set()  # every task not ended (for cancel_all)
        self.stages: dict[GangKey, str] = {}  # what that task does
        self.failures: dict[GangKey, Failure] = {}

    def busy(self, key: GangKey) -> bool:
        return key in self.tasks

    def blocks_planning(self, key: GangKey) -> bool:
        """The gang has a task in flight that changes its pods or its reservations (a release, a
        recovery): no new plan for it until that ends. A status write in flight does not."""
        return key in self.tasks and self.stages.get(key) != "status"

    def backing_off(self, key: GangKey, now: float | None = None) -> Failure | None:
        """The gang's failure while its backoff lasts (None: free to work on)."""
        failure = self.failures.get(key)
        if failure is None or failure.until <= (clock.monotonic() if now is None else now):
            return None
        return failure

    def failure_message(self, key: GangKey) -> str | None:
        failure = self.failures.get(key)
        return failure.sentence() if failure is not None else None

    def next_retry(self) -> float:
        """Monotonic time of the earliest backoff end still ahead (0: none)."""
        now = clock.monotonic()
        return min((f.until for f in self.failures.values() if f.until > now), default=0.0)

    def start(
        self, key: GangKey, stage: str, work: Coroutine[Any, Any, None], timeout: float | None = None
    ) -> bool:
        """Run `work` as the gang's task (cut off after `timeout`, default the setting); False
        (and `work` closed unrun) if it has one already, unless that one only writes its
        status: then `work` runs right after it."""
        current = self.tasks.get(key)
        if current is not None and (stage == "status" or self.stages.get(key) != "status"):
            work.close()
            return False
        run = self._run(key, stage, work, current, timeout or self.timeout)
        task = asyncio.create_task(run, name=f"gang {key[0]}/{key[1]} {stage}")
        self.tasks[key], self.stages[key] = task, stage
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        return True

    def succeeded(self, key: GangKey, stage: str) -> None:
        failure = self.failures.get(key)
        if failure is not None and failure.stage == stage:
            del self.failures[key]

    def fail(self, key: GangKey, stage: str, message: str) -> Failure:
        """Record a failure of the gang's work (also for failures found outside a task)."""
        before = self.failures.get(key)
        count = (before.count if before is not None else 0) + 1
        delay = self.backoff.delay(count)
        failure = Failure(stage, message, count, delay, clock.monotonic() + delay)
        self.failures[key] = failure
        return failure

    async def _run(
        self,
        key: GangKey,
        stage: str,
        work: Coroutine[Any, Any, None],
        after: asyncio.Task[None] | None,
        timeout: float,
    ) -> None:
        try:
            if after is not None:
                await asyncio.wait([after])  # its outcome is its own
            async with self.gate:
                async with asyncio.timeout(timeout):
                    await work
            self.succeeded(key, stage)
        except asyncio.CancelledError:
            work.close()
            raise
        except Exception as err:
            failure = self.fail(key, stage, describe(err, timeout))
            log.warning("%s/%s: %s", key[0], key[1], failure.sentence(), exc_info=err)
            if self.on_failure is not None:
                try:
                    async with asyncio.timeout(self.timeout):
                        await self.on_failure(key, failure)
                except Exception:
                    log.warning("%s/%s: the failure could not be reported", *key, exc_info=True)
        finally:
            if self.tasks.get(key) is asyncio.current_task():
                del self.tasks[key]
                self.stages.pop(key, None)
            self.on_done()

    def prune(self, live: set[GangKey]) -> None:
        """Forget the failures of gangs that are gone (keys of the form ("", what) are the
        loop's own work, never pruned)."""
        for key in [k for k in self.failures if k not in live and k not in self.tasks and k[0]]:
            del self.failures[key]

    async def cancel_all(self) -> None:
        """Stop every task (leadership is lost) and forget the failures: a new term starts clean."""
        tasks = list(self.running)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.tasks.clear()
        self.stages.clear()
        self.failures.clear()
