"""quorum installed by its Helm chart (charts/quorum) on a local instance, for tests.

The local control plane runs no containers (kwok plays the kubelets) and has no Service
network, so neither a release's Deployments nor its hook Jobs can run as pods. What they would
do is done on this machine instead:

- `start_quorum` runs quorum-webhooks and quorum-operator as local processes the way the
  release's Deployments run them: the operator with a token of the release's ServiceAccount
  quorum-operator and the environment its Deployment gives it (its settings), the webhook server
  with the settings of the release's ConfigMap and the certificate of its Secret. Calling it
  again after `helm upgrade` is the rollout: both are replaced, with what the release now says.
- `route_webhooks` is a Helm post-renderer (`python -m devcluster.helm route URL`, through the
  script `post_renderer` writes): it points the release's webhook configurations at that local
  server, a URL on 127.0.0.1 in place of the Service (as kube-proxy would route it). Nothing
  else of the release is changed, and Helm keeps the caBundle the certificate hook writes.
- `run_hook` runs a hook Job's command as the Job would, with the hook's own identity: the
  release's hook ServiceAccount and RBAC (`helm get hooks`) are created, the command runs with a
  token of that ServiceAccount, and they are deleted after, as their hook-delete-policy says.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from devcluster.build import ensure_helm
from devcluster.cluster import REPO_ROOT, ClusterError, Instance
from devcluster.kubeconfig import probe, write_kubeconfig
from devcluster.process import ProcessRecord, is_alive, spawn, tail
from quorum.install import OPERATOR_SERVICE_ACCOUNT

WEBHOOK_CONFIGURATIONS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
TLS_SECRET = "quorum-webhooks-tls"  # noqa: S105 (a name, not a secret)
HOOK = "helm.sh/hook"


def route_webhooks(stream: str, base_url: str) -> str:
    """A rendered release with each webhook's Service reference replaced by `base_url` + path."""
    docs = [d for d in yaml.safe_load_all(stream) if d]
    for doc in docs:
        if doc.get("kind") in WEBHOOK_CONFIGURATIONS:
            for webhook in doc["webhooks"]:
                service = webhook["clientConfig"].pop("service")
                webhook["clientConfig"]["url"] = base_url.rstrip("/") + service.get("path", "/")
    return yaml.safe_dump_all(docs, sort_keys=False)


def post_renderer(instance: Instance) -> Path:
    """An executable Helm runs as `--post-renderer`: `route_webhooks` to this instance's port."""
    state = instance.state()
    if state is None:
        raise ClusterError(f"instance {instance.name!r} is not up")
    script = instance.layout.root / "helm-post-renderer"
    script.write_text(
        "#!/bin/sh\n"
        "# written by devcluster.helm: the release's webhooks go to the local quorum-webhooks\n"
        f"PYTHONPATH={shlex.quote(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        "export PYTHONPATH\n"
        f"exec {shlex.quote(sys.executable)} -m devcluster.helm route "
        f"https://127.0.0.1:{state.ports.webhooks}\n"
    )
    script.chmod(0o755)
    return script


def helm(instance: Instance, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The pinned helm, as the instance's admin."""
    argv = [str(ensure_helm()), f"--kubeconfig={instance.kubeconfig('admin')}", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, timeout=300, check=False)
    if check and proc.returncode != 0:
        raise ClusterError(f"helm {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def _get_json(instance: Instance, *args: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(instance.kubectl("get", *args, "-o", "json").stdout)
    return out


def _token_kubeconfig(instance: Instance, namespace: str, account: str, path: Path) -> Path:
    token = instance.kubectl(
        "create", "token", account, f"--namespace={namespace}", "--duration=1h"
    ).stdout.strip()
    state = instance.state()
    assert state is not None
    return write_kubeconfig(
        path,
        server=state.server,
        ca_pem=(instance.layout.pki / "ca.crt").read_bytes(),
        user=f"system:serviceaccount:{namespace}:{account}",
        token=token,
        namespace=namespace,
    )


def start_quorum(instance: Instance, namespace: str, timeout: float = 60) -> None:
    """(Re)start quorum-webhooks and quorum-operator for the release installed in `namespace`."""
    state = instance.state()
    if state is None:
        raise ClusterError(f"instance {instance.name!r} is not up")
    for component in ("quorum-operator", "quorum-webhooks"):
        instance.stop_component(component)
    work = instance.layout.root / "release"
    work.mkdir(exist_ok=True)
    secret = _get_json(instance, "secret", TLS_SECRET, f"--namespace={namespace}")["data"]
    for key in ("tls.crt", "tls.key"):
        (work / key).write_bytes(base64.b64decode(secret[key]))
        (work / key).chmod(0o600)
    config = _get_json(instance, "configmap", "quorum-webhooks", f"--namespace={namespace}")["data"]
    (work / "webhooks-settings.yaml").write_text(config["settings.yaml"])
    deployment = _get_json(instance, "deployment", "quorum-operator", f"--namespace={namespace}")
    operator_env = {
        e["name"]: e["value"]
        for e in deployment["spec"]["template"]["spec"]["containers"][0].get("env", [])
        if "value" in e
    }
    _token_kubeconfig(instance, namespace, OPERATOR_SERVICE_ACCOUNT, instance.kubeconfig("quorum-operator"))
    base_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }
    ports = state.ports
    processes = {
        "quorum-webhooks": (
            [
                sys.executable,
                "-m",
                "quorum.webhooks.main",
                "--host=127.0.0.1",
                f"--port={ports.webhooks}",
                f"--cert-file={work / 'tls.crt'}",
                f"--key-file={work / 'tls.key'}",
                "--log-level=WARNING",
            ],
            {"QUORUM_WEBHOOKS_CONFIG": str(work / "webhooks-settings.yaml")},
            f"https://127.0.0.1:{ports.webhooks}/readyz",
        ),
        "quorum-operator": (
            [
                sys.executable,
                "-m",
                "quorum.operator.main",
                f"--kubeconfig={instance.kubeconfig('quorum-operator')}",
                f"--health-address=127.0.0.1:{ports.operator}",
            ],
            {**operator_env, "QUORUM_OPERATOR_NAMESPACE": namespace},
            f"http://127.0.0.1:{ports.operator}/healthz",
        ),
    }
    for component, (argv, env, health) in processes.items():
        record = spawn(
            component, argv, instance.layout.log(component), instance.layout.root, {**base_env, **env}
        )
        instance.adopt(record)
        _wait_healthy(instance, component, record, health, timeout)


def _wait_healthy(
    instance: Instance, component: str, record: ProcessRecord, url: str, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while not probe(url):
        if not is_alive(record) or time.monotonic() > deadline:
            log = instance.layout.log(component)
            raise ClusterError(f"{component} did not become healthy; last lines of {log}:\n{tail(log, 25)}")
        time.sleep(0.2)


def run_hook(
    instance: Instance, release: str, namespace: str, event: str, extra_args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run the command of the release's hook Job for `event` (post-install, pre-delete, ...) as
    the Job would: with a token of the hook's ServiceAccount, holding the hook's RBAC only while
    it runs. `extra_args` go after the Job's own (what a local stand-in needs, said by the caller)."""
    manifests = helm(instance, "get", "hooks", release, f"--namespace={namespace}").stdout
    docs = [
        d
        for d in yaml.safe_load_all(manifests)
        if d and event in d["metadata"].get("annotations", {}).get(HOOK, "").split(",")
    ]
    jobs = [d for d in docs if d["kind"] == "Job"]
    if len(jobs) != 1:
        raise ClusterError(f"release {release} has {len(jobs)} {event} hook Jobs, not one")
    pod = jobs[0]["spec"]["template"]["spec"]
    account, command = pod["serviceAccountName"], pod["containers"][0]["command"]
    identity = [d for d in docs if d["kind"] != "Job"]
    items = json.dumps({"apiVersion": "v1", "kind": "List", "items": identity})
    instance.kubectl("apply", "-f", "-", input_text=items)
    try:
        kubeconfig = _token_kubeconfig(
            instance, namespace, account, instance.layout.root / f"hook-{account}.kubeconfig"
        )
        if command[0] != "quorum":
            raise ClusterError(f"hook Job {jobs[0]['metadata']['name']} runs {command}, not a quorum command")
        argv = [sys.executable, "-m", "quorum", *command[1:], *extra_args, f"--kubeconfig={kubeconfig}"]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        return subprocess.run(
            argv, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=300, check=False
        )
    finally:
        instance.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", input_text=items)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "route":
        sys.exit("usage: python -m devcluster.helm route BASE_URL  (a Helm post-renderer: stdin to stdout)")
    sys.stdout.write(route_webhooks(sys.stdin.read(), sys.argv[2]))
