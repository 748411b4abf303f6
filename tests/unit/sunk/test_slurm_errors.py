"""What the SUNK scheduler makes of slurmrestd's answers: Slurm refusing a job (the pod is told
and not submitted again until it changes) is kept apart from Slurm not answering (the pass is
skipped and the job asked for again): a timeout must never be reported to a tenant as a refusal."""

from __future__ import annotations

import json
import socket
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorum.sunk import model
from quorum.sunk.scheduler import SunkScheduler
from quorum.sunk.settings import SunkSettings
from quorum.sunk.slurm import SlurmError, SlurmRest, SlurmUnavailable, answer_of
from tests.unit.sunk.fakes import FakeSlurm, FakeSunkApi

JSON = dict[str, Any]


def slurm_errors(*numbers: int) -> bytes:
    return orjson.dumps({"errors": [{"error_number": n, "error": f"errno {n}"} for n in numbers]})


@pytest.mark.parametrize(
    ("status", "raw"),
    [
        (502, b"<html>Bad Gateway</html>"),  # a proxy in front of slurmrestd
        (503, b""),
        (500, slurm_errors(1001)),  # SLURM_COMMUNICATIONS_CONNECTION_ERROR: slurmctld down
        (500, slurm_errors(1800)),  # SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR
        (500, slurm_errors(5004)),  # SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT
        (500, slurm_errors(11)),  # EAGAIN: temporarily unable to accept job
        (200, b"[1, 2]"),
    ],
)
def test_no_answer_about_the_request_is_unavailable(status: int, raw: bytes) -> None:
    with pytest.raises(SlurmUnavailable):
        answer_of("POST", "/job/submit", status, raw)


@pytest.mark.parametrize(
    "raw",
    [
        slurm_errors(2000),  # ESLURM_INVALID_PARTITION_NAME
        slurm_errors(2014),  # ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE
        orjson.dumps({"errors": [{"error": "Requested node configuration is not available"}]}),
    ],
)
def test_slurm_saying_no_is_a_refusal(raw: bytes) -> None:
    with pytest.raises(SlurmError) as caught:
        answer_of("POST", "/job/submit", 500, raw)
    assert not isinstance(caught.value, SlurmUnavailable)


def test_an_answer_without_errors_is_the_answer() -> None:
    assert answer_of("POST", "/job/submit", 200, orjson.dumps({"job_id": 7, "errors": []})) == {
        "job_id": 7,
        "errors": [],
    }


KEYS = st.sampled_from(["errors", "error", "error_number", "description", "job_id"])
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)


BODIES = st.binary(max_size=300) | st.builds(lambda v: json.dumps(v).encode(), VALUES)


@given(status=st.integers(100, 599), raw=BODIES)
def test_any_bytes_from_slurmrestd_give_an_answer_or_a_slurm_error(status: int, raw: bytes) -> None:
    try:
        answer = answer_of("GET", "/jobs", status, raw)
    except SlurmError:
        return
    assert isinstance(answer, dict) and status < 400


async def test_slurmrestd_not_listening_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    slurm = SlurmRest(f"http://127.0.0.1:{port}", b"k" * 32)
    try:
        with pytest.raises(SlurmUnavailable, match="slurmrestd POST /job/submit"):
            await slurm.submit({"job": {}})
    finally:
        await slurm.close()


def pod() -> JSON:
    requests = {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "2"}
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "annotations": {}},
        "spec": {
            "schedulerName": "tenant-slurm-slurm-scheduler",
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "c", "resources": {"requests": requests, "limits": requests}}],
        },
    }


async def test_a_submission_slurm_did_not_answer_is_asked_again_and_the_pod_not_told_no() -> None:
    api, slurm = FakeSunkApi(), FakeSlurm()
    slurm.refusals.append(SlurmUnavailable("slurmrestd POST /job/submit: TimeoutError: "))
    scheduler = SunkScheduler(SunkSettings(), api, slurm)
    key = "pod/ns/p/u1"
    with pytest.raises(SlurmUnavailable):  # the pass is skipped, counted as slurm_error
        await scheduler.submit(key, [pod()], model.Counts())
    assert api.events == [] and scheduler.invalid == {}

    assert await scheduler.submit(key, [pod()], model.Counts()) == 1  # the next pass
    assert [reason for _, reason, _, _ in api.events] == ["SlurmJobSubmitted"]
    assert len(slurm.bodies) == 1


async def test_a_submission_slurm_refused_is_told_once_and_not_sent_again_until_the_pod_changes() -> None:
    refusal = SlurmError("slurmrestd POST /job/submit: HTTP 500: Invalid partition name specified")
    api, slurm = FakeSunkApi(), FakeSlurm()
    slurm.refusals.append(refusal)
    scheduler = SunkScheduler(SunkSettings(), api, slurm)
    key = "pod/ns/p/u1"
    assert await scheduler.submit(key, [pod()], model.Counts()) == 0
    assert api.events == [("p", "SlurmRejected", f"Slurm did not take the job: {refusal}", True)]
    assert await scheduler.submit(key, [pod()], model.Counts()) == 0
    assert slurm.bodies == [] and len(api.events) == 1
