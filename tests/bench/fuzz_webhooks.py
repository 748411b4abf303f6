"""Fuzzer: hostile AdmissionReviews against the running quorum-webhooks server.

Starts `python -m quorum.webhooks.main` as its own process (HTTPS on 127.0.0.1, a self-made CA,
pinned to CPU 0; this client on CPU 1) and sends it `--count` cases (default 100,000), spread
over every webhook path, from these categories:

| category       | what                                                                              |
|----------------|-----------------------------------------------------------------------------------|
| not-json       | random bytes, truncated reviews, invalid UTF-8, NaN, scalars, nesting over 1,024  |
| envelope       | a review with its envelope broken: apiVersion, kind, request, uid (absent, null,  |
|                | a number, empty, huge), request.kind, operation, userInfo, namespace of any type  |
| wrong-kind     | a kind the webhook does not review                                                |
| mutation       | a realistic object (pods, gang pods, workloads, nodes) with 1-6 values replaced   |
|                | by hostile ones (any type, huge, unicode, 1,000 deep) or deleted                  |
| labels         | huge, deep, unicode, many (10,000) labels and annotations; reserved and quorum keys|
| quantities     | absurd resource quantities ("1e1000000000", 10,000 digits, -1, 2^64, NaN, objects)|
| volume         | thousands of containers, tolerations, gates, owners, env entries                  |
| null-objects   | object/oldObject null, missing, the wrong type or another kind; UPDATE vs CREATE |
| gang-labels    | label-only gangs with bad min-available values; forged quorum.dev keys; nodeName  |
| oversize       | bodies over the size limit, with a Content-Length and chunked                    |
| http           | wrong method or path, content types, gzip garbage and a gzip bomb                |
| raw            | raw TLS: bodies shorter than their Content-Length, malformed requests            |

Checks, on every answer: no HTTP 5xx; the status is one the case allows (400 for what is not a
review, 200 for every well-formed review, whatever its object); a 200 is an AdmissionReview
whose `response.uid` is the request's uid (so 200 only for a request with a non-empty string
uid); no policy error (a review answered "could not review" or "failed; admitted unchanged");
a patch applies to the object. Throughout: the process alive and /healthz answering; its RSS
(VmRSS of /proc/<pid>/status) sampled every second; at the end /metrics must count no policy
errors and RSS must be flat (the second half of the run may not add more than
`RSS_GROWTH_LIMIT`).

Then slow uploads: 48 connections each declare a 3 MiB body and trickle it for 20 s (opening
another when the server cuts one off), while an ordinary review is sent every 100 ms: every
review must be answered 200 within the webhooks' 3 s timeout, and the server's memory high-water
mark (VmHWM) must stay under its 256 MiB limit.

Reproducible: case i of seed s is always the same (`--seed s --show i` prints it). Writes
bench/results/<date>-fuzz-webhooks.json; exits 1 on any failure.

    make bench-fuzz
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gzip
import json
import os
import random
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from quorum.webhooks.patch import apply_patch
from quorum.webhooks.registry import WEBHOOKS
from quorum.webhooks.settings import WebhookSettings
from tests.bench.webhooks import realistic_pod
from tests.unit.webhooks.factories import GROUPS

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
LIMIT = WebhookSettings().max_body_bytes
RSS_GROWTH_LIMIT = 16 * 1024 * 1024  # bytes the second half of the run may add to RSS
WORKERS = 8
REQUEST_TIMEOUT = 30.0

JSON = Any
PATHS = tuple(w.path for w in WEBHOOKS)
KINDS = {w.path: w.kinds for w in WEBHOOKS}
SIGS = "pod-group.scheduling.sigs.k8s.io"
LBL_NAME = "pod-group.scheduling.sigs.k8s.io/name"
LBL_MIN = "pod-group.scheduling.sigs.k8s.io/min-available"
INTERRUPTABLE = "qos.coreweave.cloud/interruptable"


@dataclass(slots=True)
class Case:
    category: str
    path: str
    body: bytes
    expect: frozenset[int]  # HTTP statuses this case may get
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)
    chunked: bool = False  # sent without a Content-Length
    raw: bytes | None = None  # sent as is over the connection (then `body` is unused)
    hang_up: bool = False  # the raw request ends mid-body: the client hangs up, expects no answer


# -- hostile values ------------------------------------------------------------------------------

DEEP = "\x00deep:"  # a placeholder string, replaced in the serialized body by nesting this deep
DEEP_JSON = orjson.dumps(DEEP)[:-1]  # how it starts in JSON: b'"\\u0000deep:'

STRINGS = (
    "",
    " ",
    "\x00",
    "\n\r\t",
    "true",
    "True",
    "false",
    "null",
    "NaN",
    "-0",
    "0",
    "-1",
    "1e9",
    "0x10",
    "+2",
    " 3",
    "3 ",
    "1.5",
    "٣",  # Arabic-Indic three
    "𝟛",  # mathematical bold three
    "Ⅳ",
    "³",
    "1_000",
    "99999999999999999999999",
    "CREATE",
    "Pod",
    "default-scheduler",
    "cw-coscheduler",
    "coscheduler",
    "quorum.dev/gang",
    "pg-x",
    "lbl-x",
    "nvidia.com/gpu",
    "is_cpu_compute",
    "foo.coreweave.cloud/x",
    "FOO.CoreWeave.Cloud/x",
    "coreweave.cloud./x",
    "../../etc/passwd",
    "%s%n%x",
    "${jndi:ldap://x/}",
    "'; DROP TABLE pods; --",
    "\u202etxet desrever",
    "\u200b",
    "\ufeffbom",
    "e\u0301" * 50,
    "😀" * 40,
    "ꙮ",
    "名前",
)
NUMBERS: tuple[int | float, ...] = (
    0,
    1,
    -1,
    2,
    2**31 - 1,
    2**31,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    0.5,
    -0.0,
    1.5e308,
    -1e-308,
)


def hostile(rng: random.Random, depth: int = 0) -> JSON:
    """A value of any JSON type, chosen to upset code that expects another."""
    pick = rng.randrange(16)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice((True, False))
    if pick == 2:
        return rng.choice(NUMBERS)
    if pick <= 5:
        return rng.choice(STRINGS)
    if pick == 6:
        return rng.choice(("a", "é", "😀", "0", "/")) * rng.choice((63, 64, 254, 4096, 65536))
    if pick == 7:
        return "".join(
            chr(rng.choice((rng.randrange(32, 0xD800), rng.randrange(0xE000, 0x110000)))) for _ in range(40)
        )
    if pick == 8:
        return f"{DEEP}{rng.choice((10, 100, 500, 900, 990, 1000, 1010))}"
    if pick == 9:
        return []
    if pick == 10:
        return {}
    if pick == 11 and depth < 3:
        return [hostile(rng, depth + 1) for _ in range(rng.randrange(1, 4))]
    if pick == 12 and depth < 3:
        return {rng.choice(STRINGS) or "k": hostile(rng, depth + 1) for _ in range(rng.randrange(1, 4))}
    if pick == 13:
        return [None] * rng.choice((100, 1000))
    if pick == 14:
        return {f"k{i}": i for i in range(rng.choice((100, 1000)))}
    return rng.choice(STRINGS)


def serialize(value: JSON) -> bytes:
    """JSON bytes, with each `DEEP` placeholder replaced by lists or objects nested that deep
    (deeper than orjson writes, up to what it reads: 1,024)."""
    body = orjson.dumps(value)
    marker = DEEP_JSON
    if marker not in body:
        return body
    parts = body.split(marker)
    out = [parts[0]]
    for i, part in enumerate(parts[1:]):
        digits, rest = part.split(b'"', 1)
        n = int(digits)
        out.append(b"[" * n + b"]" * n if i % 2 else b'{"a":' * n + b"1" + b"}" * n)
        out.append(rest)
    return b"".join(out)


# -- seed objects -------------------------------------------------------------------------------


def pod(labels: dict[str, str] | None = None, gpu: bool = False, **spec: JSON) -> JSON:
    obj = realistic_pod(gpu)
    obj["metadata"]["labels"].update(labels or {})
    obj["spec"].update(spec)
    return obj


def workload(kind: str, labels: dict[str, str], **spec: JSON) -> JSON:
    template = {"metadata": {"labels": labels}, "spec": pod()["spec"]}
    body: JSON
    if kind == "CronJob":
        body = {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template, "parallelism": 4}}}
    else:
        body = {"template": template, "replicas": 3, "selector": {"matchLabels": labels}}
    body.update(spec)
    group = GROUPS[kind]
    return {
        "apiVersion": f"{group}/v1" if group else "v1",
        "kind": kind,
        "metadata": {"name": "w", "namespace": "ml-team"},
        "spec": body,
    }


def node() -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "gpu-001",
            "labels": {"kubernetes.io/hostname": "gpu-001", "node.coreweave.cloud/state": "production"},
        },
        "spec": {"taints": [{"key": "is_cpu_compute", "effect": "NoSchedule"}]},
    }


def seeds() -> list[tuple[str, JSON]]:
    """(kind, object): what the apiserver sends the webhooks, gang and plain."""
    gangs = [
        {SIGS: "pg1"},
        {"scheduling.x-k8s.io/pod-group": "xpg1"},
        {LBL_NAME: "job-1", LBL_MIN: "4"},
        {INTERRUPTABLE: "true"},
        {INTERRUPTABLE: "true", SIGS: "pg1"},
    ]
    found: list[tuple[str, JSON]] = [("Pod", pod()), ("Pod", pod(gpu=True))]
    found += [("Pod", pod(labels, schedulerName="cw-coscheduler")) for labels in gangs]
    found.append(("Pod", pod(schedulingGroup={"podGroupName": "w1"})))
    for kind in ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "CronJob"):
        for labels in gangs:
            found.append((kind, workload(kind, {"app": "x", **labels})))
    found += [("Node", node()), ("Namespace", {"metadata": {"name": "ml", "labels": {"team": "ml"}}})]
    return found


SEEDS = seeds()
SEED_BYTES = [(kind, orjson.dumps(obj)) for kind, obj in SEEDS]


def fresh_seed(rng: random.Random, kinds: frozenset[str] | None = None) -> tuple[str, JSON]:
    choices = [s for s in SEED_BYTES if kinds is None or s[0] in kinds] or SEED_BYTES
    kind, raw = rng.choice(choices)
    return kind, orjson.loads(raw)


def envelope(
    kind: str,
    obj: JSON,
    old: JSON = None,
    operation: str = "CREATE",
    uid: JSON = "705ab4f5-6393-11e8-b7cc-42010a800002",
    user: str = "customer@example.com",
) -> dict[str, Any]:
    group = GROUPS.get(kind, "")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": "v1", "kind": kind},
            "resource": {"group": group, "version": "v1", "resource": kind.lower() + "s"},
            "namespace": "ml-team",
            "name": "x",
            "operation": operation,
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
        },
    }


def uid(rng: random.Random) -> str:
    return (
        rng.choice(("", "u-")) + f"{rng.getrandbits(64):016x}"
        if rng.random() < 0.9
        else rng.choice(STRINGS[1:]) or "u"
    )


def path_for(rng: random.Random, kind: str) -> str:
    paths = [p for p in PATHS if kind in KINDS[p]]
    return rng.choice(paths or list(PATHS))


def slots(value: JSON, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON tree (a path of keys and indexes)."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield (*at, key)
            yield from slots(child, (*at, key))
    elif isinstance(value, list):
        for i, child in enumerate(value[:8]):
            yield (*at, i)
            yield from slots(child, (*at, i))


def mutate_at(root: JSON, where: tuple[Any, ...], rng: random.Random) -> None:
    parent = root
    for key in where[:-1]:
        parent = parent[key]
    last = where[-1]
    if isinstance(parent, dict) != isinstance(last, str):
        return  # an earlier mutation replaced a list by a map, or the reverse
    roll = rng.random()
    if roll < 0.15 and isinstance(parent, dict):
        del parent[last]
    elif roll < 0.25:
        parent[last] = None
    elif roll < 0.32:
        parent[last] = [parent[last]]
    else:
        parent[last] = hostile(rng)


# -- case generators -----------------------------------------------------------------------------


def review_case(category: str, rng: random.Random, kind: str, review: JSON, limit: int) -> Case:
    """A well-formed envelope around any object: answered with a review (200), unless the object
    or oldObject is not a map or null, the body is over the limit or nested deeper than a JSON
    parser goes (1,024 levels) (400)."""
    path = path_for(rng, kind)
    request = review["request"]
    body = serialize(review)
    expect = (
        200
        if all(o is None or isinstance(o, dict) for o in (request.get("object"), request.get("oldObject")))
        else 400
    )
    if len(body) > limit:
        expect = 400
    elif expect == 200 and (b"[[[[[[[[" in body or b'{"a":{"a":{"a":' in body):
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError:
            expect = 400
    return Case(category, path, body, frozenset({expect}))


def not_json(rng: random.Random, limit: int) -> Case:
    kind, obj = fresh_seed(rng)
    good = serialize(envelope(kind, obj, uid=uid(rng)))
    pick = rng.randrange(10)
    if pick == 0:
        body = rng.randbytes(rng.randrange(0, 2048))
    elif pick <= 3:
        body = good[: rng.randrange(0, len(good))]  # truncated
    elif pick == 4:
        at = rng.randrange(len(good))
        body = good[:at] + rng.choice((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00")) + good[at:]
    elif pick == 5:
        body = rng.choice((b"NaN", b"Infinity", b"-Infinity", b"1e999", b'{"a": NaN}', b'["\\ud800"]'))
    elif pick == 6:
        body = rng.choice((b"", b"null", b"true", b"42", b'"review"', b"[]", b"[{}]", b"{}"))
    elif pick == 7:
        n = rng.choice((1025, 5000, 100_000))
        body = b"[" * n + b"]" * n if rng.random() < 0.5 else b'{"a":' * n + b"1" + b"}" * n
    elif pick == 8:
        body = good.replace(b"{", b"{{", 1) if rng.random() < 0.5 else good + b"garbage"
    else:
        body = good.decode().encode("utf-16") if rng.random() < 0.5 else b"\xef\xbb\xbf" + good
    path = rng.choice(PATHS)
    # A UTF-8 BOM before the review is not JSON; the rest is never a review.
    return Case("not-json", path, body, frozenset({400}))


def broken_envelope(rng: random.Random, limit: int) -> Case:
    kind, obj = fresh_seed(rng)
    review = envelope(kind, obj, uid=uid(rng))
    request = review["request"]
    target = rng.choice(
        ("apiVersion", "kind", "request", "uid", "uid", "uid", "request.kind", "request.kind.kind",
         "request.kind.group", "operation", "operation", "userInfo", "userInfo.groups",
         "userInfo.username", "namespace", "name", "subResource", "dryRun", "extra")
    )  # fmt: skip
    value = hostile(rng)
    if target in ("apiVersion", "kind", "request"):
        if rng.random() < 0.2:
            del review[target]
        else:
            review[target] = value
    elif target == "extra":
        review[rng.choice(STRINGS) or "x"] = value
        request[rng.choice(STRINGS) or "y"] = value
    elif target.startswith("request.kind"):
        if target == "request.kind":
            request["kind"] = value
        else:
            request["kind"][target.rsplit(".", 1)[1]] = value
    elif target.startswith("userInfo."):
        request["userInfo"][target.split(".", 1)[1]] = value
    elif rng.random() < 0.2:
        request.pop(target, None)
    else:
        request[target] = value
    # 200 or 400 by the field; `check` holds the rest (no 200 without a string uid).
    return Case("envelope", path_for(rng, kind), serialize(review), frozenset({200, 400}))


OTHER_KINDS = (
    "ConfigMap",
    "Secret",
    "",
    "pod",
    "Pods",
    "Pod ",
    "Pod\x00",
    "Nöde",
    "Gang",
    "PodGroup",
    "Service",
)


def wrong_kind(rng: random.Random, limit: int) -> Case:
    path = rng.choice(PATHS)
    others = [k for k in (*OTHER_KINDS, *GROUPS) if k not in KINDS[path]]
    kind = rng.choice(others)
    _, obj = fresh_seed(rng)
    body = serialize(envelope(kind, obj, uid=uid(rng)))
    return Case("wrong-kind", path, body, frozenset({400}))


def mutation(rng: random.Random, limit: int) -> Case:
    kind, obj = fresh_seed(rng)
    operation = rng.choice(("CREATE", "CREATE", "UPDATE", "DELETE", "CONNECT"))
    old = orjson.loads(orjson.dumps(obj)) if operation != "CREATE" else None
    for target in [obj, old] if old is not None and rng.random() < 0.5 else [obj]:
        places = list(slots(target))
        for where in rng.sample(places, min(len(places), rng.randrange(1, 7))):
            # (an earlier mutation may have removed or replaced its parent)
            with contextlib.suppress(KeyError, IndexError, TypeError):
                mutate_at(target, where, rng)
    review = envelope(kind, obj, old, operation, uid(rng))
    return review_case("mutation", rng, kind, review, limit)


def hostile_key(rng: random.Random) -> str:
    return rng.choice(
        (
            rng.choice(STRINGS) or "k",
            "quorum.dev/" + rng.choice(("gang", "x", "requested-scheduler", "")),
            rng.choice(("", "a.", "FOO.")) + rng.choice(("coreweave.cloud", "coreweave.com")) + "/x",
            "coreweave.cloud.example.com/x",
            INTERRUPTABLE,
            SIGS,
            LBL_NAME,
            LBL_MIN,
            "scheduling.x-k8s.io/pod-group",
            "k" * rng.choice((63, 254, 65536)),
            "/" * rng.randrange(1, 50),
            "ключ/значение",
        )
    )


def labels(rng: random.Random, limit: int) -> Case:
    kind, obj = fresh_seed(rng)
    operation = rng.choice(("CREATE", "UPDATE"))
    old = orjson.loads(orjson.dumps(obj)) if operation == "UPDATE" else None
    meta = obj.setdefault("metadata", {})
    if kind not in ("Pod", "Node", "Namespace") and rng.random() < 0.7:
        template = obj["spec"]["jobTemplate"]["spec"] if kind == "CronJob" else obj["spec"]
        meta = template["template"].setdefault("metadata", {})
    where = rng.choice(("labels", "annotations"))
    pick = rng.randrange(6)
    if pick == 0:  # many
        n = rng.choice((1000, 10_000))
        meta[where] = {
            f"{rng.choice(('a', 'foo.coreweave.cloud', 'quorum.dev'))}/k{i}": "v" for i in range(n)
        }
    elif pick == 1:  # huge values
        meta.setdefault(where, {})[hostile_key(rng)] = "v" * rng.choice((63, 64, 100_000, 1_000_000))
    elif pick == 2:  # deep
        meta.setdefault(where, {})[hostile_key(rng)] = f"{DEEP}{rng.choice((100, 990, 1000, 1010))}"
    elif pick == 3:  # unicode everywhere
        meta[where] = {
            "".join(rng.choice("äö😀\u200b\u202eꙮ名/.") for _ in range(12)): "".join(
                rng.choice("äö😀\u200b\u202eꙮ名") for _ in range(20)
            )
            for _ in range(5)
        }
        meta[where][hostile_key(rng)] = rng.choice(STRINGS)
    elif pick == 4:  # any value, under a key quorum or the platform cares about
        for _ in range(rng.randrange(1, 4)):
            meta.setdefault(where, {})[hostile_key(rng)] = hostile(rng)
    else:  # the map itself of another type
        meta[where] = hostile(rng)
    review = envelope(
        kind,
        obj,
        old,
        operation,
        uid(rng),
        rng.choice(
            (
                "customer@example.com",
                "quorum:node-lifecycle",
                "system:serviceaccount:quorum-system:quorum-operator",
            )
        ),
    )
    return review_case("labels", rng, kind, review, limit)


QUANTITIES: tuple[JSON, ...] = (
    "1e1000000000",
    "9" * 10_000,
    "1" + "0" * 64,
    "1" * 64,
    "1" * 65,
    "-1",
    "0",
    "1Ei",
    "8EiB",
    "1e-1000",
    "0.000000001n",
    "NaN",
    "Inf",
    "+",
    ".",
    "...",
    "1..2",
    "١",
    " 8",
    "8\n",
    "8m8",
    "",
    8,
    8.5,
    -8,
    1.5e308,
    2**64 - 1,
    -(2**63),
    True,
    None,
    [],
    {},
    {"a": 1},
    [8],
)


def quantities(rng: random.Random, limit: int) -> Case:
    obj = pod()
    containers = obj["spec"]["containers"]
    for _ in range(rng.randrange(1, 5)):
        section = rng.choice(("requests", "limits"))
        name = rng.choice(
            ("nvidia.com/gpu", "sunk.coreweave.com/accelerator", "cpu", "memory", "ünicode/gpu")
        )
        value = rng.choice(QUANTITIES)
        target = rng.choice((*containers, obj["spec"]))  # a container, or pod-level resources
        resources = target.setdefault("resources", {})
        if rng.random() < 0.1:
            resources[section] = hostile(rng)
        elif isinstance(resources.get(section), dict):
            resources[section][name] = value
        else:
            resources[section] = {name: value}
    if rng.random() < 0.2:
        obj["spec"]["resourceClaims"] = hostile(rng)
    review = envelope("Pod", obj, uid=uid(rng))
    return review_case("quantities", rng, "Pod", review, limit)


def volume(rng: random.Random, limit: int) -> Case:
    obj = pod({SIGS: "pg1"} if rng.random() < 0.5 else {}, schedulerName="cw-coscheduler")
    spec = obj["spec"]
    field_ = rng.choice(
        ("containers", "initContainers", "tolerations", "schedulingGates", "ownerReferences", "env")
    )
    budget = min(limit // 2, 1_500_000)  # bytes of the repeated part
    one: JSON = {
        "containers": {
            "name": "c",
            "image": "i",
            "resources": {"limits": {"nvidia.com/gpu": "0", "cpu": "1"}},
        },
        "initContainers": {"name": "c", "image": "i"},
        "tolerations": {"key": "k", "operator": "Exists", "effect": "NoSchedule"},
        "schedulingGates": {"name": "example.com/gate"},
        "ownerReferences": {"apiVersion": "v1", "kind": "X", "name": "o", "uid": "u", "controller": False},
        "env": {"name": "E", "value": "v"},
    }[field_]
    most = max(1, budget // len(orjson.dumps(one)))
    n = rng.choice((min(1000, most), min(5000, most), most))
    items = [one] * n
    if field_ == "ownerReferences":
        obj["metadata"]["ownerReferences"] = items
    elif field_ == "env":
        spec["containers"][0]["env"] = items
    else:
        spec[field_] = items
    review = envelope("Pod", obj, uid=uid(rng))
    return review_case("volume", rng, "Pod", review, limit)


def null_objects(rng: random.Random, limit: int) -> Case:
    kind, obj = fresh_seed(rng)
    _, other = fresh_seed(rng)
    operation = rng.choice(("CREATE", "UPDATE", "DELETE", "CONNECT"))
    values: tuple[JSON, ...] = (None, "missing", other, [], [obj], "", 0, True, {}, {"metadata": None},
              {"metadata": {"labels": None}}, {"spec": None}, {"metadata": [], "spec": "x"}, obj)  # fmt: skip
    new, old = rng.choice(values), rng.choice(values)
    review = envelope(kind, new, old, operation, uid(rng))
    for key, value in (("object", new), ("oldObject", old)):
        if value == "missing":
            del review["request"][key]
    return review_case("null-objects", rng, kind, review, limit)


MIN_AVAILABLE = ("abc", "-1", "0", "1e9", " 3", "3 ", "9" * 10_000, "1.5", "+2", "0x10", "٣", "𝟛", "04",
                 "100001", "2147483648", "", "1_0", "4", "1", "100000")  # fmt: skip


def gang_labels(rng: random.Random, limit: int) -> Case:
    group = rng.choice(("job-1", "Job_1", "x" * 300, "", "😀", hostile(rng)))
    pod_labels: JSON = {LBL_NAME: group}
    if rng.random() < 0.9:
        pod_labels[LBL_MIN] = rng.choice(MIN_AVAILABLE) if rng.random() < 0.8 else hostile(rng)
    if rng.random() < 0.2:
        pod_labels[SIGS] = rng.choice(("pg1", hostile(rng)))
    if rng.random() < 0.2:
        pod_labels["quorum.dev/gang"] = rng.choice(("lbl-job-1", "pg-pg1", hostile(rng)))
    spec: JSON = {
        "schedulerName": rng.choice(
            ("cw-coscheduler", "coscheduler", "", "default-scheduler", "volcano", None, 7)
        )
    }
    if rng.random() < 0.2:
        spec["nodeName"] = hostile(rng)
    if rng.random() < 0.2:
        spec["schedulingGroup"] = rng.choice(({"podGroupName": "w"}, hostile(rng)))
    kind = rng.choice(("Pod", "Pod", "Pod", "StatefulSet", "Job", "Deployment"))
    obj = (
        pod(pod_labels, **spec)
        if kind == "Pod"
        else workload(kind, pod_labels, podManagementPolicy="OrderedReady")
    )
    if kind == "Pod" and rng.random() < 0.2:
        obj["metadata"]["annotations"]["quorum.dev/requested-scheduler"] = hostile(rng)
    operation = rng.choice(("CREATE", "CREATE", "UPDATE"))
    old = pod(pod_labels) if operation == "UPDATE" and kind == "Pod" else None
    review = envelope(kind, obj, old, operation, uid(rng))
    return review_case("gang-labels", rng, kind, review, limit)


def oversize(rng: random.Random, limit: int) -> Case:
    kind, obj = fresh_seed(rng, frozenset({"Pod"}))
    obj["metadata"]["annotations"]["x"] = "x" * (limit + rng.randrange(1, 1 << 20))
    body = serialize(envelope(kind, obj, uid=uid(rng)))
    return Case("oversize", path_for(rng, kind), body, frozenset({400}), chunked=rng.random() < 0.5)


def http_case(rng: random.Random, limit: int) -> Case:
    kind, obj = fresh_seed(rng, frozenset({"Pod"}))
    good = serialize(envelope(kind, obj, uid=uid(rng)))
    pick = rng.randrange(6)
    path = path_for(rng, kind)
    if pick == 0:
        method = rng.choice(("GET", "PUT", "DELETE", "PATCH", "OPTIONS"))
        return Case("http", path, good, frozenset({405}), method=method)
    if pick == 1:
        path = rng.choice(("/", "/mutate", "/mutate/pods/", "/MUTATE/PODS", "/%00", "/x" * 500))
        return Case("http", path, good, frozenset({404, 400}))
    if pick == 2:  # the content type is not what the apiserver sends: still a review
        ctype = rng.choice(
            (
                "text/plain",
                "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x",
                "",
                "application/json; charset=latin-1",
            )
        )
        return Case("http", path, good, frozenset({200}), headers={"Content-Type": ctype})
    if pick == 3:  # gzip that is not gzip
        return Case("http", path, rng.randbytes(100), frozenset({400}), headers={"Content-Encoding": "gzip"})
    if pick == 4:  # a gzip bomb: small on the wire, far over the limit unpacked
        return Case(
            "http",
            path,
            gzip.compress(b"0" * (limit * 4), 1, mtime=0),
            frozenset({400}),
            headers={"Content-Encoding": "gzip"},
        )
    # A well-formed review, gzipped: the apiserver never compresses, so it is refused too. (mtime=0:
    # a gzip header holds the time otherwise, and a case must be the same bytes on every call.)
    zipped = gzip.compress(good, mtime=0)
    return Case("http", path, zipped, frozenset({400}), headers={"Content-Encoding": "gzip"})


def raw_case(rng: random.Random, limit: int) -> Case:
    path = rng.choice(PATHS).encode()
    pick = rng.randrange(5)
    if pick == 0:  # body shorter than its Content-Length, then the client closes
        body = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x"'
        raw = b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + body
    elif pick == 1:
        raw = rng.choice(
            (
                b"GARBAGE\r\n\r\n",
                b"POST\r\n\r\n",
                b"POST " + path + b" HTTP/9.9\r\n\r\n",
                rng.randbytes(200) + b"\r\n\r\n",
            )
        )
    elif pick == 2:  # a header too long, or too many
        raw = (
            b"POST "
            + path
            + b" HTTP/1.1\r\nHost: x\r\nX: "
            + b"a" * 100_000
            + b"\r\nContent-Length: 0\r\n\r\n"
        )
        if rng.random() < 0.5:
            raw = (
                b"POST "
                + path
                + b" HTTP/1.1\r\nHost: x\r\n"
                + b"X: a\r\n" * 1000
                + b"Content-Length: 0\r\n\r\n"
            )
    elif pick == 3:  # a negative or absurd Content-Length
        length = rng.choice((b"-1", b"99999999999999999999", b"abc", b"1, 2"))
        raw = b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n{}"
    else:  # bad chunked framing
        raw = (
            b"POST "
            + path
            + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nxx\r\n0\r\n\r\n"
        )
    return Case("raw", path.decode(), b"", frozenset({400, 413, 431}), raw=raw, hang_up=pick == 0)


Generator = Callable[[random.Random, int], Case]
CATEGORIES: dict[str, tuple[float, Generator]] = {
    "not-json": (0.10, not_json),
    "envelope": (0.15, broken_envelope),
    "wrong-kind": (0.05, wrong_kind),
    "mutation": (0.30, mutation),
    "labels": (0.10, labels),
    "quantities": (0.08, quantities),
    "volume": (0.01, volume),
    "null-objects": (0.08, null_objects),
    "gang-labels": (0.10, gang_labels),
    "oversize": (0.002, oversize),
    "http": (0.015, http_case),
    "raw": (0.003, raw_case),
}


def case(seed: int, i: int, limit: int = LIMIT) -> Case:
    """Case `i` of a run: the same for the same seed, whatever ran before it."""
    rng = random.Random(seed * 1_000_003 + i)
    roll, total = rng.random() * sum(w for w, _ in CATEGORIES.values()), 0.0
    for weight, generate in CATEGORIES.values():
        total += weight
        if roll < total:
            return generate(rng, limit)
    return mutation(rng, limit)


# -- checks ---------------------------------------------------------------------------------------


def request_of(body: bytes) -> dict[str, Any] | None:
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    request = review.get("request") if isinstance(review, dict) else None
    return request if isinstance(request, dict) else None


def check(case_: Case, status: int, answer: bytes) -> list[str]:
    """What is wrong with the server's answer to a case ([] if nothing)."""
    problems = []
    if status >= 500:
        problems.append(f"HTTP {status}")
    if status not in case_.expect:
        problems.append(f"HTTP {status}, expected {sorted(case_.expect)}")
    if status == 400 and case_.raw is None and case_.method == "POST" and case_.path in PATHS:
        try:
            error = orjson.loads(answer)
            if not isinstance(error.get("error"), str) or "Traceback" in error["error"]:
                problems.append(f"400 without a short error: {answer[:200]!r}")
        except (orjson.JSONDecodeError, AttributeError):
            problems.append(f"400 body is not JSON: {answer[:200]!r}")
    if status != 200:
        return problems
    request = request_of(gzip.decompress(case_.body) if "gzip" in case_.headers.values() else case_.body)
    if request is None or type(request.get("uid")) is not str or not request["uid"]:
        return [*problems, "200 for a request without a non-empty string uid"]
    try:
        response = orjson.loads(answer)["response"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return [*problems, f"200 is not an AdmissionReview: {answer[:200]!r}"]
    if response.get("uid") != request["uid"]:
        problems.append(f"uid {response.get('uid')!r} answered for {request['uid'][:80]!r}")
    if type(response.get("allowed")) is not bool:
        problems.append("response.allowed is not a boolean")
    status_ = response.get("status") or {}
    message = str(status_.get("message", ""))
    if status_.get("code") == 500 or "could not review" in message:
        problems.append(f"policy error: {message[:200]}")
    if any("failed; admitted unchanged" in w for w in response.get("warnings") or ()):
        problems.append("policy error: admitted unchanged")
    if "patch" in response:
        try:
            ops = orjson.loads(base64.b64decode(response["patch"]))
            apply_patch(request.get("object"), ops)
        except RecursionError:
            pass  # an object too deep for this checker's deepcopy; the server answered it
        except Exception as err:
            problems.append(f"patch does not apply: {type(err).__name__}: {err}"[:300])
    return problems


# -- sending -------------------------------------------------------------------------------------


@dataclass
class Tally:
    sent: Counter[str] = field(default_factory=Counter)
    statuses: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    failures: list[dict[str, Any]] = field(default_factory=list)
    failure_count: int = 0
    no_answer: Counter[str] = field(default_factory=Counter)  # raw cases the server closed on
    denied: Counter[str] = field(default_factory=Counter)  # reviews answered allowed: false
    slowest: dict[str, float] = field(default_factory=dict)

    def record(
        self, index: int, case_: Case, status: int | None, answer: bytes, seconds: float, error: str = ""
    ) -> None:
        self.sent[case_.category] += 1
        self.slowest[case_.category] = max(self.slowest.get(case_.category, 0.0), seconds)
        if status is None:
            self.no_answer[case_.category] += 1
            if not case_.hang_up:
                self.fail(index, case_, [error or "no answer"])
            return
        self.statuses[case_.category][str(status)] += 1
        if status == 200 and b'"allowed":false' in answer:
            self.denied[case_.category] += 1
        if problems := check(case_, status, answer):
            self.fail(index, case_, problems)

    def fail(self, index: int, case_: Case, problems: list[str]) -> None:
        self.failure_count += 1
        if len(self.failures) < 50:
            self.failures.append(
                {"case": index, "category": case_.category, "path": case_.path, "problems": problems}
            )

    def totals(self) -> dict[str, int]:
        totals: Counter[str] = Counter()
        for counts in self.statuses.values():
            for status, n in counts.items():
                totals[status[0] + "xx"] += n
        return dict(sorted(totals.items()))


async def send_raw(host: str, port: int, tls: ssl.SSLContext | None, case_: Case) -> tuple[int | None, bytes]:
    """The status of the answer to a raw request (None: no answer, or a hang-up case)."""
    assert case_.raw is not None
    reader, writer = await asyncio.open_connection(host, port, ssl=tls)
    try:
        writer.write(case_.raw)
        await writer.drain()
        if case_.hang_up:
            return None, b""
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
        except (TimeoutError, ConnectionError, ssl.SSLError):
            return None, b""
        parts = line.split()
        return (int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None), line
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def chunks(body: bytes) -> AsyncIterator[bytes]:
    for at in range(0, len(body), 256 * 1024):
        yield body[at : at + 256 * 1024]


async def send(
    session: aiohttp.ClientSession, base: str, tls: ssl.SSLContext | None, case_: Case
) -> tuple[int | None, bytes]:
    if case_.raw is not None:
        host, port = base.split("//", 1)[1].rsplit(":", 1)
        return await send_raw(host, int(port), tls, case_)
    headers = {"Content-Type": "application/json", **case_.headers}
    data: Any = chunks(case_.body) if case_.chunked else case_.body
    async with session.request(
        case_.method, base + case_.path, data=data, headers=headers, ssl=tls or False,
        auto_decompress=False,
    ) as response:  # fmt: skip
        return response.status, await response.read()


async def run_cases(
    base: str,
    tls: ssl.SSLContext | None,
    indexes: range,
    seed: int,
    limit: int = LIMIT,
    workers: int = WORKERS,
    every: Callable[[int], Any] | None = None,
) -> Tally:
    """Send cases `indexes` of `seed` with `workers` connections; `every(done)` is awaited every
    1,000 cases (health and RSS probes)."""
    tally = Tally()
    queue = iter(indexes)
    done = 0
    connector = aiohttp.TCPConnector(limit=workers, force_close=False)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:

        async def worker() -> None:
            nonlocal done
            for index in queue:
                case_ = case(seed, index, limit)
                started, error = time.perf_counter(), ""
                try:
                    status, answer = await send(session, base, tls, case_)
                except (aiohttp.ClientError, ConnectionError, TimeoutError, ssl.SSLError) as err:
                    status, answer = None, b""
                    error = f"client error: {type(err).__name__}: {err}"[:300]
                tally.record(index, case_, status, answer, time.perf_counter() - started, error)
                done += 1
                if every is not None and done % 1000 == 0:
                    await every(done)

        await asyncio.gather(*(worker() for _ in range(workers)))
    return tally


# -- slow and oversized uploads ------------------------------------------------------------------

SLOW_CLIENTS = 48  # connections that each declare a 3 MiB body and trickle it
SLOW_SECONDS = 20.0  # how long the slow clients keep at it
MEMORY_LIMIT = 256 * 1024 * 1024  # the Deployment's memory limit (manifests/20-webhooks-deployment.yaml)
REVIEW_TIMEOUT = 3.0  # the webhooks' timeoutSeconds: the apiserver waits no longer


def high_water_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for {pid}")


async def slow_client(host: str, port: int, tls: ssl.SSLContext, until: float, cut: list[int]) -> None:
    """Declare a body of the size limit, then send 64 KiB every half second; when the server
    cuts the connection off, open another, until `until`."""
    head = (
        f"POST /validate/pods HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {LIMIT}\r\n\r\n"
    ).encode()
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection(host, port, ssl=tls)
        except (ConnectionError, OSError, ssl.SSLError):
            await asyncio.sleep(0.1)
            continue
        try:
            writer.write(head)
            while time.monotonic() < until and not reader.at_eof():
                writer.write(b" " * 65536)
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        if await reader.read(1):  # the server answered (cut it off)
                            cut.append(1)
                            break
        except (ConnectionError, OSError, ssl.SSLError):
            cut.append(1)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def slow_uploads(base: str, tls: ssl.SSLContext, pid: int) -> dict[str, Any]:
    """`SLOW_CLIENTS` slow 3 MiB uploads for `SLOW_SECONDS`, and meanwhile one ordinary review
    every 100 ms: each must be answered 200 within the webhooks' timeout, and the server's
    memory high-water mark must stay under its limit."""
    host, port = base.split("//", 1)[1].rsplit(":", 1)
    until = time.monotonic() + SLOW_SECONDS
    cut: list[int] = []
    slow = [asyncio.create_task(slow_client(host, int(port), tls, until, cut)) for _ in range(SLOW_CLIENTS)]
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    body = serialize(envelope("Pod", pod({"app": "bystander"}), uid="bystander"))
    timeout = aiohttp.ClientTimeout(total=REVIEW_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.sleep(1.0)  # the slow ones connected and holding
        while time.monotonic() < until:
            started = time.perf_counter()
            try:
                headers = {"Content-Type": "application/json"}
                async with session.post(
                    base + "/mutate/pods", data=body, ssl=tls, headers=headers
                ) as response:
                    await response.read()
                    statuses[str(response.status)] += 1
            except (aiohttp.ClientError, TimeoutError) as err:
                statuses[type(err).__name__] += 1
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.1)
    await asyncio.gather(*slow, return_exceptions=True)
    latencies.sort()
    return {
        "slow_clients": SLOW_CLIENTS,
        "seconds": SLOW_SECONDS,
        "slow_bodies_cut_off": len(cut),
        "reviews": len(latencies),
        "review_statuses": dict(statuses),
        "review_ms": {
            "p50": round(latencies[len(latencies) // 2] * 1000, 1) if latencies else None,
            "max": round(latencies[-1] * 1000, 1) if latencies else None,
        },
        "high_water_mib": round(high_water_bytes(pid) / 2**20, 1),
    }


# -- the run against the real process ------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(work: Path, port: int) -> subprocess.Popen[bytes]:
    pin = ["taskset", "-c", "0"] if os.cpu_count() and os.cpu_count() > 1 else []  # type: ignore[operator]
    return subprocess.Popen(
        [*pin, sys.executable, "-m", "quorum.webhooks.main", f"--port={port}",
         f"--dev-certs={work / 'tls'}", "--log-level=WARNING"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=(work / "server.log").open("wb"),
    )  # fmt: skip


async def healthy(session: aiohttp.ClientSession, base: str, tls: ssl.SSLContext) -> bool:
    try:
        async with session.get(base + "/healthz", ssl=tls) as response:
            return response.status == 200 and await response.text() == "ok"
    except (aiohttp.ClientError, ConnectionError, TimeoutError):
        return False


async def fuzz(count: int, seed: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="quorum-fuzz-"))
    port = free_port()
    server = start_server(work, port)
    base = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not (work / "tls" / "ca.crt").exists() or not _listening(port):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"quorum-webhooks did not start: {(work / 'server.log').read_text()}")
            await asyncio.sleep(0.1)
        tls = ssl.create_default_context(cafile=str(work / "tls" / "ca.crt"))
        if len(os.sched_getaffinity(0)) > 1:
            os.sched_setaffinity(0, {1})  # this client on the other core
        async with aiohttp.ClientSession() as probe:
            rss: list[tuple[float, int, int]] = []  # (seconds, cases done, bytes)
            health: list[bool] = []
            started = time.monotonic()
            rss.append((0.0, 0, rss_bytes(server.pid)))
            warm = await run_cases(base, tls, range(count, count + 2000), seed)  # warm-up, not counted
            rss.append((time.monotonic() - started, 0, rss_bytes(server.pid)))
            before = rss[-1][2]

            async def every(done: int) -> None:
                rss.append((time.monotonic() - started, done, rss_bytes(server.pid)))
                if done % 10_000 == 0:
                    health.append(server.poll() is None and await healthy(probe, base, tls))
                    print(f"  {done:,} cases, RSS {rss[-1][2] / 2**20:.1f} MiB", flush=True)

            fuzz_started = time.monotonic()
            tally = await run_cases(base, tls, range(count), seed, every=every)
            elapsed = time.monotonic() - fuzz_started
            alive = server.poll() is None
            health.append(alive and await healthy(probe, base, tls))
            after = rss_bytes(server.pid) if alive else 0
            print(
                f"  {SLOW_CLIENTS} slow uploads of {LIMIT / 2**20:.0f} MiB for {SLOW_SECONDS:.0f}s ...",
                flush=True,
            )
            slowloris = await slow_uploads(base, tls, server.pid) if alive else {}
            alive = server.poll() is None
            metrics = ""
            if alive:
                async with probe.get(base + "/metrics", ssl=tls) as response:
                    metrics = await response.text()
        policy_errors = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("quorum_webhook_policy_errors_total{")
        )
        middle = next((b for _, done, b in rss if done >= count // 2), after)
        peak = max(b for _, _, b in rss)
    finally:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=10)
        if server.poll() is None:
            server.kill()
    log = (work / "server.log").read_text(errors="replace")
    checks = {
        "no 5xx": all(not s.startswith("5") for c in tally.statuses.values() for s in c),
        "server alive, /healthz ok at every probe": alive and all(health),
        "every answer as expected (uid echoed, no policy error, patch applies)": tally.failure_count == 0,
        "no policy errors in /metrics": policy_errors == 0,
        "RSS flat (second half adds < 16 MiB)": after - middle < RSS_GROWTH_LIMIT,
        "no traceback in the server log": "Traceback" not in log,
        "under slow uploads, every review answered 200 within the webhooks' 3 s timeout": bool(slowloris)
        and slowloris["review_statuses"] == {"200": slowloris["reviews"]}
        and slowloris["review_ms"]["max"] < REVIEW_TIMEOUT * 1000,
        "memory high-water mark under the 256 MiB limit": bool(slowloris)
        and slowloris["high_water_mib"] * 2**20 < MEMORY_LIMIT,
    }
    if all(checks.values()):
        shutil.rmtree(work, ignore_errors=True)  # else kept: the server's log is the evidence
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "seed": seed,
        "cases": sum(tally.sent.values()),
        "seconds": round(elapsed, 1),
        "by_category": {
            name: {
                "sent": tally.sent[name],
                "statuses": dict(sorted(tally.statuses[name].items())),
                "denied": tally.denied[name],
                "no_answer": tally.no_answer[name],
                "slowest_ms": round(tally.slowest.get(name, 0.0) * 1000, 1),
            }
            for name in CATEGORIES
        },
        "totals": tally.totals(),
        "no_answer": sum(tally.no_answer.values()),
        "failures": tally.failure_count,
        "first_failures": tally.failures,
        "warm_up_failures": warm.failure_count,
        "rss_mib": {
            "start": round(rss[0][2] / 2**20, 1),
            "before": round(before / 2**20, 1),
            "middle": round(middle / 2**20, 1),
            "peak": round(peak / 2**20, 1),
            "after": round(after / 2**20, 1),
        },
        "slow_uploads": slowloris,
        "health_probes": len(health),
        "policy_errors_metric": policy_errors,
        "server_log_lines": len(log.splitlines()),
        "checks": checks,
        "server_log": "" if all(checks.values()) else str(work / "server.log"),
    }


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--show", type=int, metavar="I", help="print case I of the seed and exit")
    parser.add_argument("--no-write", action="store_true", help="do not write bench/results/")
    args = parser.parse_args(argv)
    if args.show is not None:
        c = case(args.seed, args.show)
        about = {"category": c.category, "method": c.method, "path": c.path, "expect": sorted(c.expect)}
        print(json.dumps({**about, "headers": c.headers, "chunked": c.chunked}))
        sys.stdout.buffer.write((c.raw if c.raw is not None else c.body)[:4000] + b"\n")
        return 0
    print(f"fuzzing quorum-webhooks: {args.count:,} cases, seed {args.seed}", flush=True)
    result = asyncio.run(fuzz(args.count, args.seed))
    print("\n| category | sent | 2xx (of which denied) | 4xx | 5xx | no answer | slowest (ms) |")
    print("|---|---|---|---|---|---|---|")
    for name, row in result["by_category"].items():
        classes = Counter[str]()
        for status, n in row["statuses"].items():
            classes[status[0] + "xx"] += n
        print(
            f"| {name} | {row['sent']:,} | {classes['2xx']:,} ({row['denied']:,}) | {classes['4xx']:,} | "
            f"{classes['5xx']} | {row['no_answer']} | {row['slowest_ms']} |"
        )
    totals = result["totals"]
    denied = sum(row["denied"] for row in result["by_category"].values())
    print(
        f"| **all** | {result['cases']:,} | {totals.get('2xx', 0):,} ({denied:,}) | "
        f"{totals.get('4xx', 0):,} | {totals.get('5xx', 0)} | {result['no_answer']} | |"
    )
    print(f"\n{result['cases']:,} cases in {result['seconds']} s; RSS (MiB): {result['rss_mib']}")
    for failure in result["first_failures"][:20]:
        print("FAIL", failure)
    for name, ok in result["checks"].items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    if result["server_log"]:
        print(f"the server's log: {result['server_log']}")
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = RESULTS / f"{result['date']}-fuzz-webhooks.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"written to {out}")
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
