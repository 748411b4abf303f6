"""The objects of a test DRA driver (`resource.k8s.io/v1`), as plain dicts ready to apply: a
device with attributes, one ResourceSlice per node, a DeviceClass and a ResourceClaimTemplate.

Nothing runs behind them: kwok's nodes have no kubelet and no driver, so a pod whose claims are
allocated simply runs. tests/integration/test_dra.py and the peer benchmark's `contention-dra`
and `together-dra` scenarios (tests/bench/peers.py) publish them; docs/dra.md says what quorum
does with them.
"""

from __future__ import annotations

import secrets
from typing import Any

API_VERSION = "resource.k8s.io/v1"
DRIVER = "gpu.example.com"


def device(i: int, model: str = "H100", **flags: bool) -> dict[str, Any]:
    """GPU `gpu-<i>`: its model, index and a random uuid, the given boolean attributes, 80Gi."""
    attributes: dict[str, Any] = {
        "model": {"string": model},
        "index": {"int": i},
        "uuid": {"string": f"GPU-{secrets.token_hex(8)}"},  # as NVIDIA names them: never read as a number
    }
    attributes.update({k: {"bool": v} for k, v in flags.items()})
    return {"name": f"gpu-{i}", "attributes": attributes, "capacity": {"memory": {"value": "80Gi"}}}


def resource_slice(driver: str, node: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    """The node's devices as the driver publishes them: one pool named after the node, local to
    it, in one slice (`<node>-<driver>`) of generation 1."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def device_class(name: str, driver: str, extended_resource: str | None = None) -> dict[str, Any]:
    """A DeviceClass of every device of `driver`; with `extended_resource`, pods may ask for its
    devices by that name too (the extended-resource mapping)."""
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}
    if extended_resource is not None:
        spec["extendedResourceName"] = extended_resource
    return {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def claim_template(name: str, device_class: str, count: int, *selectors: str) -> dict[str, Any]:
    """A ResourceClaimTemplate whose claims ask, in one request named `gpus`, exactly `count`
    devices of the class that pass every CEL selector given."""
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}},
    }


def attribute_selector(driver: str, name: str) -> str:
    """A CEL selector of the devices whose boolean attribute `name` (of the driver's domain) is
    true; a device without it fails the selector, as in Kubernetes."""
    return f'device.attributes["{driver}"].{name}'


def resource_claim(name: str, device_class: str, count: int) -> dict[str, Any]:
    """A ResourceClaim that pods name (`resourceClaimName`) to share its devices: `count` devices
    of the class, in one request named `gpus`."""
    exactly = {"deviceClassName": device_class, "count": count}
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}},
    }
