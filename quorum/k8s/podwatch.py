"""The operator's one watch of pods: a kubernetes-asyncio list+watch of every pod, each event
handed to the indexes that want it (the gang pods of the Store, the usage of bound pods).

One watch, not kopf's of gang pods plus one of bound pods: a gang pod's binding and status
changes came twice (the apiserver sent them twice, the operator parsed them twice), and kopf's
per-event processing was two fifths of the operator's CPU in the throughput benchmark
(docs/benchmarks.md). A label selector cannot say "gang pods or bound pods", so the watch takes
every pod and the indexes keep what they need.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import orjson
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger("quorum.k8s.podwatch")


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


class PodIndex(Protocol):
    """What the watch feeds: every pod it sees (an index keeps those it wants), removals by uid,
    and the whole listing after a (re)list."""

    def upsert(self, pod: dict[str, Any]) -> None: ...

    def remove(self, uid: str) -> None: ...

    def replace_all(self, pods: list[dict[str, Any]]) -> None: ...


async def watch_pods(
    api: client.ApiClient,
    indexes: Sequence[PodIndex],
    synced: asyncio.Event,
    on_change: Callable[[], None],
) -> None:
    """Keep `indexes` current until cancelled; set `synced` after the first listing; relist when
    the watch expires (410 Gone)."""
    core = client.CoreV1Api(api)
    backoff = 0.5
    while True:
        try:
            response: Any = await core.list_pod_for_all_namespaces(_preload_content=False)
            listing = await response.json()
            for index in indexes:
                index.replace_all(listing["items"])
            synced.set()
            on_change()
            version = listing["metadata"]["resourceVersion"]
            backoff = 0.5
            while True:
                stream = RawWatch().stream(
                    core.list_pod_for_all_namespaces,
                    resource_version=version,
                    timeout_seconds=300,
                    allow_watch_bookmarks=True,
                )
                async with stream as events:
                    async for event in events:
                        raw = event["raw_object"]
                        if event["type"] == "ERROR":
                            raise ApiException(status=raw.get("code", 500), reason=raw.get("message"))
                        version = raw["metadata"].get("resourceVersion", version)
                        if event["type"] == "BOOKMARK":
                            continue
                        if event["type"] == "DELETED":
                            for index in indexes:
                                index.remove(raw["metadata"]["uid"])
                        else:
                            for index in indexes:
                                index.upsert(raw)
                        on_change()
        except asyncio.CancelledError:
            raise
        except ApiException as err:
            if err.status != 410:
                log.warning("pod watch failed (%s); retrying in %.1fs", err.reason, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30)
        except Exception:
            log.exception("pod watch failed; retrying in %.1fs", backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30)
