"""What quorum-operator keeps per gang pod and per node, measured on the operator's own indexes
(no cluster): N copies of a bound GPU gang pod and M of a GPU node, as a 200-node `make
bench-scale` run had them (tests/bench/data/: a pod of the scheduler-plugins way with the
quorum.dev/gang label added; managedFields dropped as the watch drops them), each
parsed anew by orjson as the watch parses events, fed to the indexes the watch feeds (the Store's
gang pods and nodes, the bound pods' usage) and to the planner's models (`NodeModels`,
`PodModels`). tracemalloc gives the bytes held per object once fed, and the peak of a relisting
of the pods by the watch's own `list_in_pages`: from an apiserver answering in one page, and in
pages of LIST_PAGE.

    make bench-memory
    python -m tests.bench.operator_memory --pods 23631 --nodes 5000   # bench-scale's largest

Writes bench/results/<date>-operator-memory.json.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import sys
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from quorum.k8s.reads import LIST_PAGE, list_in_pages
from quorum.k8s.usage import BoundPods
from quorum.operator.gangs import GangPods, Store, store_nodes
from quorum.operator.snapshot import NodeModels, PodModels

DATA = Path(__file__).resolve().parent / "data"
RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
JSON = dict[str, Any]


def copies(template: JSON, count: int, prefix: str) -> list[bytes]:
    """`count` copies of `template` with their own name and uid, serialised (as events come)."""
    out = []
    for i in range(count):
        obj = copy.deepcopy(template)
        obj["metadata"]["name"] = f"{prefix}-{i:06d}"
        obj["metadata"]["uid"] = f"00000000-0000-4000-8000-{i:012d}"
        out.append(orjson.dumps(obj))
    return out


def held(start: tracemalloc.Snapshot) -> int:
    return sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(start, "filename"))


class Page:
    """An apiserver's answer, unparsed (`_preload_content=False`)."""

    status = 200

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def read(self) -> bytes:
        return self.body


async def relist_peak(gang_pods: GangPods, events: list[bytes], page: int) -> int:
    """The peak of traced memory above what was held while `list_in_pages` lists `events` in
    pages of `page` and the Store takes the listing (the bodies are made before, as the
    apiserver's are not the operator's)."""
    chunks = [events[i : i + page] for i in range(0, len(events), page)]
    bodies = []
    for number, chunk in enumerate(chunks):
        following = f',"continue":"{number + 1}"' if number + 1 < len(chunks) else ""
        metadata = b'{"resourceVersion":"7"' + following.encode() + b"}"
        bodies.append(b'{"kind":"PodList","metadata":' + metadata + b',"items":[' + b",".join(chunk) + b"]}")

    async def list_call(**kwargs: Any) -> Page:
        return Page(bodies[int(kwargs.get("_continue") or 0)])

    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    items, _ = await list_in_pages(list_call)
    gang_pods.replace_all(items)
    del items
    return tracemalloc.get_traced_memory()[1] - before


def measure(pods: int, nodes: int) -> dict[str, Any]:
    pod = json.loads((DATA / "bound-gpu-pod.json").read_text())
    node = json.loads((DATA / "kwok-gpu-node.json").read_text())
    pod_events, node_events = copies(pod, pods, "pod"), copies(node, nodes, "node")
    store, usage = Store(), BoundPods()
    gang_pods, node_table = GangPods(store), store_nodes(store)
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.take_snapshot()
    for raw in pod_events:
        obj = orjson.loads(raw)
        gang_pods.upsert(obj)
        usage.upsert(obj)
    pods_held = held(start)
    mark = tracemalloc.take_snapshot()
    for raw in node_events:
        node_table.upsert(orjson.loads(raw))
    node_models = NodeModels()  # kept by the loop between passes
    node_models.refresh(store.nodes)
    nodes_held = held(mark)
    mark = tracemalloc.take_snapshot()
    models = PodModels()
    for obj in store.pods.values():
        models(obj)
    models_held = held(mark)
    # A relisting of the pods through the watch's own `list_in_pages`, from an apiserver that
    # answers pages of `page` (all in one: as before LIST_PAGE): the peak above what was held.
    relist = {}
    for page in (pods, LIST_PAGE):
        relist[page] = asyncio.run(relist_peak(gang_pods, pod_events, page))
    tracemalloc.stop()
    mib = 1024 * 1024
    return {
        "pods": pods,
        "nodes": nodes,
        "pod_json_bytes": len(pod_events[0]),
        "node_json_bytes": len(node_events[0]),
        "bytes_per_gang_pod": round(pods_held / pods),  # the Store's pod and its usage entry
        "bytes_per_pod_model": round(models_held / pods),
        "bytes_per_node": round(nodes_held / nodes),  # the Store's node and its planner model
        "held_mib": round((pods_held + models_held + nodes_held) / mib, 1),
        "relist_peak_above_held_mib": round(relist[pods] / mib, 1),  # one page
        f"relist_peak_above_held_mib_pages_of_{LIST_PAGE}": round(relist[LIST_PAGE] / mib, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--pods", type=int, default=5032, help="gang pods (bench-scale at 1,000 nodes: 5,032)"
    )
    parser.add_argument("--nodes", type=int, default=1000)
    args = parser.parse_args()
    started = time.monotonic()
    figures = measure(max(1, args.pods), max(1, args.nodes))
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    data = {"date": stamp, "seconds": round(time.monotonic() - started, 1), **figures}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{stamp}-operator-memory-{figures['pods']}x{figures['nodes']}.json"
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data, indent=2))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
