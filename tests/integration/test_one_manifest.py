"""`make release-manifests`: dist/quorum.yaml and dist/quorum-sunk.yaml each install quorum with
one `kubectl apply --server-side -f` on a cluster that has none of it, every object of the file
is then there, and applying it again changes nothing. dist/podgroups.scheduling.x-k8s.io.yaml
is for `kubectl create` alone.

The one-manifest install takes its certificate from cert-manager, which does not run here: its
two kinds (Issuer, Certificate) are stood in by schemaless CRDs, so that the objects can be
stored; what cert-manager makes of them is its own."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.cluster import REPO_ROOT, Instance

pytestmark = pytest.mark.cluster

Key = tuple[str, str, str]


def cert_manager_stand_in() -> dict[str, Any]:
    crds = [
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.cert-manager.io"},
            "spec": {
                "group": "cert-manager.io",
                "scope": "Namespaced",
                "names": {
                    "kind": kind,
                    "plural": plural,
                    "singular": kind.lower(),
                    "listKind": f"{kind}List",
                },
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        }
        for kind, plural in (("Issuer", "issuers"), ("Certificate", "certificates"))
    ]
    return {"apiVersion": "v1", "kind": "List", "items": crds}


def objects_of(path: Path) -> set[Key]:
    return {
        (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
        for d in yaml.safe_load_all(path.read_text())
        if d
    }


def live(instance: Instance, path: Path) -> dict[Key, dict[str, Any]]:
    """Each object of the file as the apiserver has it now, but what no apply writes: its status
    and a Deployment's revision (controllers write them when they get to it: a policy's type
    check, the rollout) and the bookkeeping of
    who applied what (a server-side apply that changes no field still re-records its manager's
    entry where another manager has one too, and with it the resourceVersion)."""
    items = json.loads(instance.kubectl("get", "-f", str(path), "-o", "json").stdout)["items"]
    out = {}
    for item in items:
        for field in ("managedFields", "resourceVersion"):
            item["metadata"].pop(field, None)
        item.pop("status", None)
        (item["metadata"].get("annotations") or {}).pop("deployment.kubernetes.io/revision", None)
        out[(item["kind"], item["metadata"].get("namespace", ""), item["metadata"]["name"])] = item
    return out


async def test_the_one_manifests_install_with_one_server_side_apply_and_apply_again_as_a_no_op(
    start_instance: Callable[..., Instance], tmp_path: Path
) -> None:
    made = subprocess.run(  # noqa: ASYNC221 (before anything else runs)
        ["make", "-s", "release-manifests", f"DIST={tmp_path}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    instance = start_instance("t-manifest", install_manifests=False, webhooks=False, operator=False)
    assert "gangs.quorum.dev" not in instance.kubectl("get", "crd", "-o", "name").stdout
    instance.kubectl("create", "-f", "-", input_text=json.dumps(cert_manager_stand_in()))
    instance.wait_established("crd/issuers.cert-manager.io", "crd/certificates.cert-manager.io")

    for name in ("quorum.yaml", "quorum-sunk.yaml"):
        manifest = tmp_path / name
        applied = instance.kubectl("apply", "--server-side", "-f", str(manifest), check=False)
        assert applied.returncode == 0, f"{name}: {applied.stderr}"
        assert set(live(instance, manifest)) == objects_of(manifest), name
        namespace = json.loads(instance.kubectl("get", "namespace", "quorum-system", "-o", "json").stdout)
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"

        # The type checker's status write lands whenever it gets to it: between the diff's read
        # of the live object and its dry run, it would show as a change.
        policies = [n for kind, _, n in objects_of(manifest) if kind == "ValidatingAdmissionPolicy"]
        assert instance.wait_type_checked(*policies), f"{name}: policies not type-checked in 60 s"
        diff = instance.kubectl("diff", "--server-side", "-f", str(manifest), check=False)
        assert diff.returncode == 0, f"{name}: applying again would change:\n{diff.stdout}{diff.stderr}"

        before = live(instance, manifest)
        again = instance.kubectl("apply", "--server-side", "-f", str(manifest), check=False)
        assert again.returncode == 0, f"{name}: {again.stderr}"
        after = live(instance, manifest)
        changed = [str(k) for k in before if before[k] != after[k]]
        assert not changed, f"{name}: applying again changed {changed}"

    sunk = objects_of(tmp_path / "quorum-sunk.yaml") - objects_of(tmp_path / "quorum.yaml")
    assert ("Deployment", "quorum-system", "quorum-sunk-scheduler") in sunk
    assert not objects_of(tmp_path / "quorum.yaml") - objects_of(tmp_path / "quorum-sunk.yaml")
    assert ("CustomResourceDefinition", "", "podgroups.scheduling.x-k8s.io") not in objects_of(
        tmp_path / "quorum.yaml"
    ), "apply would take scheduler-plugins' CRD over"
    crd = str(tmp_path / "podgroups.scheduling.x-k8s.io.yaml")
    assert instance.kubectl("create", "-f", crd, check=False).returncode == 0
    again = instance.kubectl("create", "-f", crd, check=False)
    assert again.returncode != 0 and "AlreadyExists" in again.stderr
