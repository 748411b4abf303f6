"""What quorum reads of API discovery and of raw list answers: an error is an error, never "not
served" or an empty listing (an apiserver starting up answers 403 before its RBAC is loaded),
and the Kubernetes PodGroups a listing gives without apiVersion and kind get them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import kube_config

from quorum.k8s import reads
from quorum.k8s.api import LiveApi
from quorum.k8s.reads import LIST_PAGE
from quorum.k8s.watch import watch_objects
from quorum.operator.gangs import Store, store_composites, store_groups
from quorum.operator.handlers import served
from tests.unit.recording_apiserver import RecordingApiserver


class Answer:
    """A raw (`_preload_content=False`) answer of the apiserver."""

    def __init__(self, status: int, body: Any) -> None:
        self.status, self.reason, self.body = status, "reason", body

    async def json(self) -> Any:
        return self.body

    async def read(self) -> bytes:
        return orjson.dumps(self.body)


class Listings:
    """A watch's index that keeps every listing it is given, in order: each `replace_all` starts
    one, the upserts after it fill it."""

    def __init__(self) -> None:
        self.seen: list[list[Any]] = []

    def upsert(self, obj: Any) -> None:
        self.seen[-1].append(obj)

    def delete(self, obj: Any) -> None: ...

    def replace_all(self, objs: list[Any]) -> None:
        self.seen.append(list(objs))


class Discovery:
    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)

    async def call_api(self, *args: Any, **kwargs: Any) -> Answer:
        return self.answers.pop(0)


def apiserver(*answers: Answer) -> Any:
    """An ApiClient that gives these answers, in order."""
    return Discovery(*answers)


GROUPS = {
    "kind": "APIGroupList",
    "groups": [{"name": "scheduling.k8s.io", "versions": [{"version": "v1"}, {"version": "v1beta1"}]}],
}


async def test_discovery_says_what_is_served_and_fails_rather_than_guess() -> None:
    assert await reads.served_versions(apiserver(Answer(200, GROUPS)), "scheduling.k8s.io") == [
        "v1",
        "v1beta1",
    ]
    assert await reads.served_versions(apiserver(Answer(200, GROUPS)), "other.io") == []
    for status, body in ((403, {"kind": "Status", "code": 403}), (200, {"kind": "Status"}), (200, [])):
        with pytest.raises(ApiException):
            await reads.served_versions(apiserver(Answer(status, body)), "scheduling.k8s.io")


async def test_a_served_listing_follows_the_version_served_and_says_404_when_none() -> None:
    heard: list[str | None] = []
    listing = reads.ServedListing(
        apiserver(Answer(200, {"kind": "APIGroupList", "groups": []})),
        "scheduling.k8s.io",
        "podgroups",
        ("v1beta1", "v1alpha2"),
        heard.append,
    )
    with pytest.raises(ApiException) as none:
        await listing()
    assert none.value.status == 404 and heard == [None]


async def test_an_error_answer_to_a_list_is_retried_not_taken_for_an_empty_listing() -> None:
    """403 then a listing: the index is filled once, from the listing; a 404 (a CRD not
    installed) lists as empty and counts as synced."""
    answers = [
        Answer(403, {"kind": "Status", "code": 403}),
        Answer(
            200,
            {"items": [{"metadata": {"name": "a", "namespace": "n"}}], "metadata": {"resourceVersion": "1"}},
        ),
    ]
    index = Listings()

    async def list_call(**kwargs: Any) -> Answer:
        if kwargs.get("watch"):
            await asyncio.sleep(3600)
        return answers.pop(0)

    synced = asyncio.Event()
    task = asyncio.create_task(watch_objects(list_call, [index], synced, lambda: None, "things"))
    await asyncio.wait_for(synced.wait(), 5)
    task.cancel()
    assert index.seen == [[{"metadata": {"name": "a", "namespace": "n"}}]], "the 403 filled nothing"

    answers[:] = [Answer(404, {"kind": "Status", "code": 404})]
    synced = asyncio.Event()
    index.seen.clear()
    task = asyncio.create_task(watch_objects(list_call, [index], synced, lambda: None, "things"))
    await asyncio.wait_for(synced.wait(), 5)
    task.cancel()
    assert index.seen == [[]]


def test_podgroups_listed_without_apiversion_and_kind_get_the_served_ones() -> None:
    store = Store(pod_group_version="v1beta1", composite_version="v1alpha3")
    store_groups(store, "scheduling.k8s.io").upsert({"metadata": {"name": "g", "namespace": "n"}})
    store_composites(store).upsert({"metadata": {"name": "c", "namespace": "n"}})
    group = store.groups[("scheduling.k8s.io", "n", "g")]
    assert (group["apiVersion"], group["kind"]) == ("scheduling.k8s.io/v1beta1", "PodGroup")
    assert store.composites[("n", "c")]["kind"] == "CompositePodGroup"
    store_groups(store, "scheduling.sigs.k8s.io").upsert(
        {
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "s", "namespace": "n"},
        }
    )
    assert store.groups[("scheduling.sigs.k8s.io", "n", "s")]["apiVersion"].endswith("v1alpha1")


async def test_a_404_once_listed_keeps_what_was_listed_and_lists_again() -> None:
    """An apiserver restarting answers 404 for a CRD's list for a while: the Gangs it listed
    before stay (a pass must not plan without the reservations they record)."""
    item = {"metadata": {"name": "a", "namespace": "n"}}
    answers = [
        Answer(200, {"items": [item], "metadata": {"resourceVersion": "1"}}),
        Answer(404, {"kind": "Status", "code": 404}),
        Answer(200, {"items": [item], "metadata": {"resourceVersion": "2"}}),
    ]
    replaced: list[int] = []
    held: dict[str, Any] = {}
    relisted = asyncio.Event()

    class Index:
        def upsert(self, obj: Any) -> None:
            held[obj["metadata"]["name"]] = obj

        def delete(self, obj: Any) -> None: ...

        def replace_all(self, objs: list[Any]) -> None:
            held.clear()
            replaced.append(len(answers))

    async def list_call(**kwargs: Any) -> Answer:
        if kwargs.get("watch"):
            raise ApiException(status=500, reason="the apiserver went away")
        if not answers:
            relisted.set()
            await asyncio.sleep(3600)
        return answers.pop(0)

    task = asyncio.create_task(watch_objects(list_call, [Index()], asyncio.Event(), lambda: None, "gangs"))
    await asyncio.wait_for(relisted.wait(), 10)
    task.cancel()
    assert replaced == [2, 0], "emptied only to take a listing, never for the 404"
    assert list(held) == ["a"]


def test_not_served_holds_only_when_discovery_says_so_for_30_seconds() -> None:
    now = [0.0]
    store = Store(pod_group_version="v1beta1")
    found = served(store, "pod_group", clock=lambda: now[0])
    found(None)
    now[0] += 0.5
    found(None)  # retried half a second later: still not 30 s
    assert store.pod_group_version == "v1beta1", "odd answers release nothing"
    found("v1beta1")
    now[0] += 29
    found(None)
    assert store.pod_group_version == "v1beta1"
    now[0] += 31
    found(None)
    assert store.pod_group_version is None and not store.workload_api
    found("v1alpha3")
    assert store.pod_group_version == "v1alpha3"


async def test_quorums_own_gangs_are_never_taken_for_not_installed() -> None:
    """At start, while the apiserver still loads its CRDs, the Gang list answers 404: that is an
    error to retry, not an empty listing to plan on."""
    answers = [
        Answer(404, {"kind": "Status", "code": 404}),
        Answer(
            200,
            {"items": [{"metadata": {"name": "g", "namespace": "n"}}], "metadata": {"resourceVersion": "1"}},
        ),
    ]
    listings: list[int] = []

    class Index:
        def upsert(self, obj: Any) -> None: ...

        def delete(self, obj: Any) -> None: ...

        def replace_all(self, objs: list[Any]) -> None:
            listings.append(len(answers))

    async def list_call(**kwargs: Any) -> Answer:
        if kwargs.get("watch"):
            await asyncio.sleep(3600)
        return answers.pop(0)

    synced = asyncio.Event()
    task = asyncio.create_task(
        watch_objects(list_call, [Index()], synced, lambda: None, "gangs", required=True)
    )
    await asyncio.wait_for(synced.wait(), 10)
    task.cancel()
    assert listings == [0], "synced only by the real listing"


async def test_a_listing_comes_in_pages_and_the_indexes_take_it_whole() -> None:
    """Lists ask for LIST_PAGE objects at a time (a listing parsed in one piece costs many times
    its body); the indexes take all pages at once, and a continue token that expired between
    pages (410 Gone) starts the listing again from its first page."""
    a, b, c = ({"metadata": {"name": n, "namespace": "x"}} for n in "abc")
    pages: dict[str | None, tuple[list[Any], str | None]] = {None: ([a, b], "t1"), "t1": ([c], None)}
    expired = [True]
    calls: list[tuple[Any, Any]] = []
    index = Listings()

    async def list_call(**kwargs: Any) -> Answer:
        if kwargs.get("watch"):
            await asyncio.sleep(3600)
        token = kwargs.get("_continue")
        calls.append((kwargs.get("limit"), token))
        if token == "t1" and expired[0]:
            expired[0] = False
            return Answer(410, {"kind": "Status", "code": 410, "reason": "Expired"})
        items, following = pages[token]
        metadata = {"resourceVersion": "7"} | ({"continue": following} if following else {})
        return Answer(200, {"items": items, "metadata": metadata})

    synced = asyncio.Event()
    task = asyncio.create_task(watch_objects(list_call, [index], synced, lambda: None, "pods"))
    await asyncio.wait_for(synced.wait(), 5)
    task.cancel()
    assert calls == [(LIST_PAGE, None), (LIST_PAGE, "t1"), (LIST_PAGE, None), (LIST_PAGE, "t1")]
    assert index.seen == [[a, b, c]], "one listing, whole: nothing taken from the expired one"


async def test_a_new_leaders_listings_come_in_pages_and_keep_only_versions(tmp_path: Path) -> None:
    """A replica that takes the lead lists every gang pod and Gang afresh (`GangLoop.take_over`):
    in pages, as the watches list, and of the pods it keeps only their versions. A listing of a
    large cluster's pods in one piece took the operator's memory up by half a gigabyte at the
    moment it took over (2026-11-29: 1,155 MiB after one lost Lease at 5,000 nodes, 614 MiB
    without). Through the real client, against an apiserver that pages."""
    pods = 2 * LIST_PAGE + 1
    with RecordingApiserver(tmp_path) as fake:
        made = []
        for i in range(pods):
            labels = {"quorum.dev/gang": f"pg-g{i % 7}"}
            made.append(
                fake.put("", "pods", {"metadata": {"name": f"p{i}", "namespace": "ns", "labels": labels}})
            )
        fake.put("", "pods", {"metadata": {"name": "not-a-gang-pod", "namespace": "ns"}})
        for i in range(LIST_PAGE + 1):
            fake.put("quorum.dev", "gangs", {"metadata": {"name": f"pg-g{i}", "namespace": "ns"}})
        configuration = client.Configuration()
        await kube_config.load_kube_config(
            config_file=str(fake.kubeconfig), client_configuration=configuration
        )
        async with client.ApiClient(configuration) as api:
            live = LiveApi(api)
            versions = await live.gang_pod_versions()
            listed_gangs = await live.list_gangs()
            claims = await live.resource_claim_versions()
    assert versions == {p["metadata"]["uid"]: p["metadata"]["resourceVersion"] for p in made}
    assert len(listed_gangs) == LIST_PAGE + 1 and claims == {}
    pages = [
        (r.path, dict(r.query).get("limit"), dict(r.query).get("continue"))
        for r in fake.requests
        if r.method == "GET" and r.path in ("/api/v1/pods", "/apis/quorum.dev/v1alpha1/gangs")
    ]
    limit = str(LIST_PAGE)
    assert pages == [
        ("/api/v1/pods", limit, None),
        ("/api/v1/pods", limit, limit),
        ("/api/v1/pods", limit, str(2 * LIST_PAGE)),
        ("/apis/quorum.dev/v1alpha1/gangs", limit, None),
        ("/apis/quorum.dev/v1alpha1/gangs", limit, limit),
    ]
