"""`quorum explain`'s planning reads against a fake apiserver (aiohttp, in this process): every
cluster-wide list is read in pages of `PAGE`, and when the reads fail or take longer than
`PLANNING_SECONDS` explain shows the recorded view (which needs only the Gang) and says why,
instead of failing as if the apiserver could not be reached."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from quorum.commands import explain
from quorum.k8s import command_reads

JSON = dict[str, Any]
GANG = {
    "apiVersion": "quorum.dev/v1alpha1",
    "kind": "Gang",
    "metadata": {
        "namespace": "ml",
        "name": "pg-train",
        "uid": "g1",
        "creationTimestamp": "2027-01-15T08:00:00Z",
    },
    "spec": {"minMember": 3},
    "status": {
        "phase": "Pending",
        "members": 3,
        "conditions": [
            {
                "type": "Admitted",
                "status": "False",
                "reason": "Unschedulable",
                "message": "needs 3 pods placed together; no preemption (NothingToPreempt): nothing lower",
                "lastTransitionTime": "2027-01-15T08:00:00Z",
            }
        ],
    },
}


@dataclass
class FakeApiserver:
    """Lists by path, paged as the apiserver pages (limit, continue: here the offset); `stall`
    and `fail`: the page of a path (by its continue token) that hangs, or answers that status."""

    lists: dict[str, list[JSON]]
    stall: tuple[str, str] | None = None
    fail: tuple[str, str, int] | None = None
    pages: list[tuple[str, str, str]] = field(default_factory=list)  # (path, limit, continue)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if request.method == "POST" and path.endswith("/selfsubjectaccessreviews"):
            return web.json_response({"status": {"allowed": True}})
        if path == "/apis":
            return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
        if path == "/apis/quorum.dev/v1alpha1/namespaces/ml/gangs/pg-train":
            return web.json_response(GANG)
        if path == "/api/v1/namespaces/ml/events":
            return web.json_response({"items": []})
        if path not in self.lists:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        limit, token = request.query.get("limit", ""), request.query.get("continue", "")
        self.pages.append((path, limit, token))
        if self.stall == (path, token):
            await asyncio.sleep(3600)
        if self.fail is not None and self.fail[:2] == (path, token):
            return web.json_response({"kind": "Status", "code": self.fail[2]}, status=self.fail[2])
        items = self.lists[path]
        start, size = int(token or 0), int(limit or len(items) or 1)
        rest = str(start + size) if start + size < len(items) else ""
        return web.json_response({"metadata": {"continue": rest}, "items": items[start : start + size]})


def cluster(pods: int) -> dict[str, list[JSON]]:
    node = {"metadata": {"name": "n"}, "spec": {}, "status": {"allocatable": {"cpu": "8", "pods": "110"}}}
    return {
        "/api/v1/nodes": [{**node, "metadata": {"name": f"n{i}"}} for i in range(3)],
        "/api/v1/pods": [
            {"metadata": {"namespace": "other", "name": f"p{i}", "uid": f"u{i}"}, "spec": {}, "status": {}}
            for i in range(pods)
        ],
        "/apis/quorum.dev/v1alpha1/gangs": [GANG],
        "/apis/policy/v1/poddisruptionbudgets": [],
    }


@pytest.fixture
async def serve() -> AsyncIterator[Any]:
    servers: list[TestServer] = []
    clients: list[client.ApiClient] = []

    async def start(fake: FakeApiserver) -> client.ApiClient:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", fake.handle)
        server = TestServer(app)
        await server.start_server()
        servers.append(server)
        api = client.ApiClient(client.Configuration(host=str(server.make_url("")).rstrip("/")))
        clients.append(api)
        return api

    yield start
    for api in clients:
        await api.close()
    for server in servers:
        await server.close()


async def test_every_cluster_wide_list_is_read_in_pages(serve: Any) -> None:
    fake = FakeApiserver(cluster(pods=1234))
    api = await serve(fake)
    found = await command_reads.cluster_objects(api)
    assert len(found.pods) == 1234 and len(found.nodes) == 3 and len(found.gangs) == 1
    pod_pages = [(limit, token) for path, limit, token in fake.pages if path == "/api/v1/pods"]
    assert pod_pages == [("500", ""), ("500", "500"), ("500", "1000")]
    assert {limit for _, limit, _ in fake.pages} == {str(command_reads.PAGE)}, "every list is paged"


async def test_planning_reads_that_take_too_long_give_the_recorded_view_and_say_why(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(explain, "PLANNING_SECONDS", 1.0)
    fake = FakeApiserver(cluster(pods=1234), stall=("/api/v1/pods", "500"))
    api = await serve(fake)
    started = time.monotonic()
    diagnosis = await explain.diagnose(api, "ml", "pg-train", time.time())
    assert time.monotonic() - started < 10, "bounded, not the 30 s of each read"
    assert diagnosis.view.startswith("as recorded by quorum-operator at ")
    assert diagnosis.view.endswith("(reading every node and pod took over 1s)"), diagnosis.view
    assert diagnosis.message == "needs 3 pods placed together"
    assert any("(3 nodes and 500 pods read)" in note for note in diagnosis.notes), diagnosis.notes


@pytest.mark.parametrize("status", [410, 500])
async def test_planning_reads_that_fail_give_the_recorded_view_and_say_why(serve: Any, status: int) -> None:
    """410: the continue token expired (a list read in pages for longer than etcd keeps its
    revision); 500: the apiserver's trouble. Neither is "cannot reach the apiserver"."""
    fake = FakeApiserver(cluster(pods=1234), fail=("/api/v1/pods", "1000", status))
    api = await serve(fake)
    diagnosis = await explain.diagnose(api, "ml", "pg-train", time.time())
    assert f"(reading every node and pod failed (the apiserver answered {status} " in diagnosis.view
    assert any("(3 nodes and 1000 pods read)" in note for note in diagnosis.notes), diagnosis.notes
