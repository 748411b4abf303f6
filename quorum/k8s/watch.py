"""quorum's own list+watch of pods and nodes (kubernetes-asyncio, plain JSON): each event is
handed to the indexes that want it (the gang pods of the Store and the usage of bound pods; the
Store's nodes).

Pods: one watch, not kopf's of gang pods plus one of bound pods: a gang pod's binding and status
changes came twice (the apiserver sent them twice, the operator parsed them twice), and kopf's
per-event processing was two fifths of the operator's CPU in the throughput benchmark
(docs/benchmarks.md). A label selector cannot say "gang pods or bound pods", so the watch takes
every pod and the indexes keep what they need. Nodes: the same kind of watch, so that a node's
change reaches the planner as fast as a pod's (behind kopf's slower processing, a node that had
just become Ready could be missed by the plan of a gang whose pods came right after it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import orjson
from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.k8s.reads import list_in_pages

log = logging.getLogger("quorum.k8s.watch")


class RawWatch(watch.Watch):
    """A watch whose events carry plain JSON only: the stock one also turns every object into
    a model (V1Pod), which costs more than everything quorum does with the event. Objects are
    parsed with orjson: parsing was a quarter of the operator's CPU with the standard library's
    json (py-spy, throughput benchmark)."""

    def get_return_type(self, func: object) -> str:
        return ""

    def unmarshal_event(self, data: str | bytes, response_type: str | None) -> Any:
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return data
        if not isinstance(event, dict):
            return data
        obj = event.get("object")
        if event.get("type") in ("ADDED", "MODIFIED", "DELETED") and isinstance(obj, dict):
            event["raw_object"] = obj
            self.resource_version = (obj.get("metadata") or {}).get("resourceVersion", self.resource_version)
            return event
        return super().unmarshal_event(data, response_type)  # errors, bookmarks: the stock way


class Index(Protocol):
    """What a watch feeds: every object it sees (an index keeps those it wants), deletions, and
    the whole listing after a (re)list."""

    def upsert(self, obj: dict[str, Any]) -> None: ...

    def delete(self, obj: dict[str, Any]) -> None: ...

    def replace_all(self, objs: list[dict[str, Any]]) -> None: ...


def apply(indexes: Sequence[Index], kind: str, obj: dict[str, Any], what: str) -> None:
    """Hand one event to every index. An object an index cannot take (fed garbage) is logged and
    skipped: it must not stop the watch for every other object. managedFields are dropped
    first: nothing of the operator's reads them on a watched object, and kept for every pod and
    node of a large cluster they were a large part of what it holds (and of what each full
    garbage collection walks)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)
    for index in indexes:
        try:
            (index.delete if kind == "DELETED" else index.upsert)(obj)
        except Exception:
            name = (obj.get("metadata") or {}).get("name")
            log.warning(
                "%s watch: %s %s not taken by %s", what, kind, name, type(index).__name__, exc_info=True
            )


YIELD_EVERY = 50  # events handled before the watch yields to the event loop
WATCH_SECONDS = 300  # the apiserver ends each watch after this; the client gives it 30 s more


async def watch_objects(
    list_call: Callable[..., Awaitable[Any]],
    indexes: Sequence[Index],
    synced: asyncio.Event,
    on_change: Callable[[], None],
    what: str = "",
    required: bool = False,
) -> None:
    """Keep `indexes` current with the objects `list_call` (a kubernetes-asyncio list of a
    cluster-wide resource) lists, until cancelled; set `synced` after the first listing; relist
    when the watch expires (410 Gone). A resource the apiserver does not serve at start (404:
    its CRD is not installed) lists as empty, counts as synced, and is listed again every 30 s.
    A 404 once it has been listed keeps what the indexes hold and lists again soon: an apiserver
    restarting answers 404 for a while (its CRDs not loaded yet), and emptying the Gangs then
    would make a pass plan without the reservations they record. Every request has a time
    limit: a hung apiserver connection is dropped and made again, never waited on forever.
    `required`: a 404 is never "not installed" (quorum's own CRD), always an error to retry."""
    what = what or getattr(list_call, "__name__", "objects")
    backoff = 0.5
    listed = False
    while True:
        try:
            try:
                items, version = await list_in_pages(list_call)
            except ApiException as err:
                if err.status != 404 or listed or required:
                    raise
                for index in indexes:
                    index.replace_all([])
                synced.set()
                on_change()
                await asyncio.sleep(30)
                continue
            for index in indexes:  # in one go, no await: a pass never sees half a listing
                index.replace_all([])
            for obj in items:
                apply(indexes, "ADDED", obj, what)
            if listed:  # the watch expired (410 Gone) or failed: worth seeing when it is often
                log.info("%s listed again: %d objects", what, len(items))
            del items
            listed = True
            synced.set()
            on_change()
            backoff = 0.5
            while True:
                stream = RawWatch().stream(
                    list_call,
                    resource_version=version,
                    timeout_seconds=WATCH_SECONDS,
                    allow_watch_bookmarks=True,
                    _request_timeout=WATCH_SECONDS + 30,
                )
                async with stream as events:
                    handled = 0
                    async for event in events:
                        handled += 1
                        if handled % YIELD_EVERY == 0:
                            await asyncio.sleep(0)  # a burst arrives buffered: let the loop breathe
                        raw = event["raw_object"]
                        if event["type"] == "ERROR":
                            raise ApiException(status=raw.get("code", 500), reason=raw.get("message"))
                        version = raw["metadata"].get("resourceVersion", version)
                        if event["type"] == "BOOKMARK":
                            continue
                        apply(indexes, event["type"], raw, what)
                        on_change()
        except asyncio.CancelledError:
            raise
        except ApiException as err:
            if err.status != 410:
                log.warning("%s watch failed (%s); retrying in %.1fs", what, err.reason, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30)
        except Exception:
            log.exception("%s watch failed; retrying in %.1fs", what, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30)
