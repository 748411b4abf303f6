"""The `cks` way of `make bench-admission` judges with quorum's own CEL (tests/bench/cks.py)."""

from __future__ import annotations

import yaml

from tests.bench.cks import MANIFESTS, cks_policies


def test_the_cks_policies_are_quorums_own_cel_alone() -> None:
    by_name = {(p["kind"], p["metadata"]["name"]): p for p in cks_policies()}
    assert set(by_name) == {
        (kind, name)
        for name in ("cks-cpu-toleration", "cks-reserved-labels", "cks-interruptable-gang-pods")
        for kind in (
            ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
            if name == "cks-cpu-toleration"
            else ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
        )
    }
    defaults = next(
        d
        for d in yaml.safe_load_all((MANIFESTS / "35-pod-defaults.yaml").read_text())
        if d and d["kind"] == "MutatingAdmissionPolicy"
    )
    variables = {v["name"]: v["expression"] for v in defaults["spec"]["variables"]}
    (condition,) = by_name[("MutatingAdmissionPolicy", "cks-cpu-toleration")]["spec"]["matchConditions"]
    assert condition["expression"] == f"!({variables['accelerated']}) && !({variables['tolerated']})"
    patch = by_name[("MutatingAdmissionPolicy", "cks-cpu-toleration")]["spec"]["mutations"][0]["jsonPatch"]
    assert "quorum.dev" not in patch["expression"] and "is_cpu_compute" in patch["expression"]
    reserved = by_name[("ValidatingAdmissionPolicy", "cks-reserved-labels")]["spec"]
    assert [c["name"] for c in reserved["matchConditions"]] == [
        "not-a-platform-identity",
        "adds-changes-or-removes-a-reserved-label",
    ]
    assert reserved["matchConstraints"]["resourceRules"][0]["resources"] == ["pods", "nodes", "namespaces"]
    warn = by_name[("ValidatingAdmissionPolicyBinding", "cks-interruptable-gang-pods")]["spec"]
    assert warn["validationActions"] == ["Warn"]
    assert all(
        "quorum.dev/gang" not in str(p["spec"]) for p in by_name.values() if "Binding" not in p["kind"]
    )
