"""How the harness counts a pod's requests (as kube-scheduler does)."""

from __future__ import annotations

from fractions import Fraction

from tests.kube import pod_requests


def c(**requests: str) -> dict:  # type: ignore[type-arg]
    return {"name": "c", "resources": {"requests": requests}}


def test_containers_add_up_and_count_one_pod() -> None:
    pod = {"spec": {"containers": [c(cpu="1", memory="1Gi"), c(cpu="500m")]}}
    assert pod_requests(pod) == {"cpu": Fraction(3, 2), "memory": Fraction(2**30), "pods": 1}


def test_init_containers_take_the_max_sidecars_add() -> None:
    pod = {
        "spec": {
            "initContainers": [c(cpu="4"), {**c(cpu="1"), "restartPolicy": "Always"}, c(cpu="2")],
            "containers": [c(cpu="1")],
            "overhead": {"cpu": "100m"},
        }
    }
    # max(steady 1 + sidecar 1, init 4, sidecar 1 + init 2) + overhead
    assert pod_requests(pod)["cpu"] == Fraction(4) + Fraction(1, 10)
