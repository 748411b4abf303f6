"""What every bound, non-terminal pod uses, per node: the planner's view of occupied capacity.

A kubernetes-asyncio list+watch of all pods with `spec.nodeName!=` that are neither Succeeded
nor Failed (a pod leaving that selection arrives as DELETED). Only what the planner needs is
kept: for each pod uid, its node and effective requests; for each node, the sum.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.core.model import add, subtract
from quorum.k8s.convert import pod_requests

log = logging.getLogger("quorum.k8s.usage")

FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


class RawWatch(watch.Watch):
    """A watch whose events carry plain JSON only: the stock one also turns every object into
    a model (V1Pod), which costs more than everything quorum does with the event."""

    def get_return_type(self, func: object) -> str:
        return ""


class BoundPods:
    def __init__(self) -> None:
        self.pods: dict[str, tuple[str, dict[str, int]]] = {}  # uid -> (node, requests)
        self.used: dict[str, dict[str, int]] = {}  # node -> sum of requests
        self.synced = asyncio.Event()
        # Nodes whose usage changed since the planner last asked (None: all of them, a relist).
        self.dirty: set[str] | None = None

    def take_dirty(self) -> set[str] | None:
        dirty, self.dirty = self.dirty, set()
        return dirty

    def _mark(self, node: str) -> None:
        if self.dirty is not None:
            self.dirty.add(node)

    def upsert(self, pod: dict[str, Any]) -> None:
        uid, node = pod["metadata"]["uid"], (pod.get("spec") or {}).get("nodeName")
        self.remove(uid)
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        requests = pod_requests(pod)
        self.pods[uid] = (node, requests)
        self.used[node] = add(self.used.get(node, {}), requests)
        self._mark(node)

    def remove(self, uid: str) -> None:
        old = self.pods.pop(uid, None)
        if old is not None:
            node, requests = old
            self.used[node] = subtract(self.used.get(node, {}), requests)
            self._mark(node)

    def replace_all(self, pods: list[dict[str, Any]]) -> None:
        self.pods.clear()
        self.used.clear()
        for pod in pods:
            self.upsert(pod)
        self.dirty = None  # a relist: the planner compares every node


async def watch_bound_pods(api: client.ApiClient, index: BoundPods, on_change: Callable[[], None]) -> None:
    """Keep `index` current until cancelled; relist when the watch expires (410 Gone)."""
    core = client.CoreV1Api(api)
    backoff = 0.5
    while True:
        try:
            response: Any = await core.list_pod_for_all_namespaces(
                field_selector=FIELD_SELECTOR, _preload_content=False
            )
            listing = await response.json()
            index.replace_all(listing["items"])
            index.synced.set()
            on_change()
            version = listing["metadata"]["resourceVersion"]
            backoff = 0.5
            while True:
                stream = RawWatch().stream(
                    core.list_pod_for_all_namespaces,
                    field_selector=FIELD_SELECTOR,
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
                            index.remove(raw["metadata"]["uid"])
                        else:
                            index.upsert(raw)
                        on_change()
        except asyncio.CancelledError:
            raise
        except ApiException as err:
            if err.status != 410:
                log.warning("bound-pod watch failed (%s); retrying in %.1fs", err.reason, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30)
        except Exception:
            log.exception("bound-pod watch failed; retrying in %.1fs", backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30)
