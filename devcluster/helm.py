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
  token of that ServiceAccount, and they are deleted after, as their hook-delete-policy says
  (for `helm ... --no-hooks`).
- `HookKubelet` lets Helm run the hooks itself (no `--no-hooks`): while it runs, each pod of a
  Job annotated `helm.sh/hook` that kwok has made Running (kwok's pod-complete Stage leaves pods
  labelled app.kubernetes.io/component=helm-hook alone) has its container's command run here,
  with a token of the pod's ServiceAccount (which Helm made, with its RBAC, as a hook resource),
  and is then ended Succeeded or Failed by the exit code, as a kubelet would. The Job controller
  then completes or fails the Job, and Helm goes on or stops, as on a cluster.
- `route_installed_webhooks` does what `route_webhooks` does to webhook configurations already
  installed (by a command that used no post-renderer, e.g. the README's).
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import shlex
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
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


def routed(doc: dict[str, Any], base_url: str) -> dict[str, Any]:
    """A webhook configuration with each Service reference replaced by `base_url` + its path (a
    webhook already given a URL is left as it is); other objects unchanged."""
    if doc.get("kind") in WEBHOOK_CONFIGURATIONS:
        for webhook in doc["webhooks"]:
            service = webhook["clientConfig"].pop("service", None)
            if service is not None:
                webhook["clientConfig"]["url"] = base_url.rstrip("/") + service.get("path", "/")
    return doc


def route_webhooks(stream: str, base_url: str) -> str:
    """A rendered release with each webhook's Service reference replaced by `base_url` + path."""
    docs = [routed(d, base_url) for d in yaml.safe_load_all(stream) if d]
    return yaml.safe_dump_all(docs, sort_keys=False)


def local_webhooks_url(instance: Instance) -> str:
    state = instance.state()
    if state is None:
        raise ClusterError(f"instance {instance.name!r} is not up")
    return f"https://127.0.0.1:{state.ports.webhooks}"


def route_installed_webhooks(instance: Instance, name: str = "quorum-webhooks") -> None:
    """Point the installed webhook configurations `name` at the local quorum-webhooks (what the
    post-renderer does at install time; their caBundle is kept)."""
    for kind in WEBHOOK_CONFIGURATIONS:
        found = _get_json(instance, kind.lower(), name)
        instance.kubectl(
            "replace", "-f", "-", input_text=json.dumps(routed(found, local_webhooks_url(instance)))
        )


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
        f"exec {shlex.quote(sys.executable)} -m devcluster.helm route {local_webhooks_url(instance)}\n"
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


# -- the hook kubelet ------------------------------------------------------------------------------

COMPONENT_LABEL = "app.kubernetes.io/component"
HOOK_POD = "helm-hook"  # the label value kwok's pod-complete Stage leaves to the hook kubelet


@dataclass
class HookRun:
    """One hook pod run by the `HookKubelet`."""

    namespace: str
    job: str
    events: tuple[str, ...]  # the Job's helm.sh/hook annotation
    pod: str
    account: str
    command: list[str]  # the container's command and args, as the pod has them
    observed: Any  # what the kubelet's `observe` returned just before the command started
    returncode: int = -1
    output: str = ""
    seconds: float = 0.0  # from the pod found Running to its status written


@dataclass
class HookKubelet:
    """Runs the pods of Helm's hook Jobs on this machine while Helm waits for them (the module
    docstring). Use as a context manager around the helm command:

        with HookKubelet(instance, {("quorum", "certs", "ensure"): ("--san", "127.0.0.1")}) as kubelet:
            subprocess.run(["helm", "upgrade", "-i", ...])
        kubelet.check()

    `extra_args` are added to a command that starts with the key: what a local stand-in needs
    (here: the address at which the apiserver reaches the local webhook server, in place of the
    Service's name, in the certificate). `observe` is called just before each command starts,
    its result kept in the run (what existed then: the order of hooks and release). Commands run
    one at a time, as Helm runs hooks; `quorum ...` runs this checkout with this Python."""

    instance: Instance
    extra_args: Mapping[tuple[str, ...], tuple[str, ...]] = field(default_factory=dict)
    observe: Callable[[], Any] | None = None
    interval: float = 0.2
    runs: list[HookRun] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _seen: set[str] = field(default_factory=set)

    def __enter__(self) -> HookKubelet:
        self._thread = threading.Thread(target=self._loop, name="hook-kubelet", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=330)

    def check(self) -> None:
        """Raise if the kubelet met anything it could not do as a kubelet would."""
        if self.errors:
            raise ClusterError("hook kubelet: " + "; ".join(self.errors))

    def _loop(self) -> None:
        rest = self.instance.rest()
        while not self._stop.is_set():
            try:
                self._pass(rest)
            except Exception as err:  # kept, reported by check()
                self.errors.append(f"{type(err).__name__}: {err}")
            self._stop.wait(self.interval)

    def _pass(self, rest: Any) -> None:
        status, body = rest.get("/apis/batch/v1/jobs")
        if status != 200:
            return  # the apiserver is busy or restarting: the next pass looks again
        for job in json.loads(body)["items"]:
            annotations = job["metadata"].get("annotations") or {}
            if HOOK not in annotations:
                continue
            namespace, uid = job["metadata"]["namespace"], job["metadata"]["uid"]
            selector = urllib.parse.quote(f"batch.kubernetes.io/controller-uid={uid}")
            status, body = rest.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")
            if status != 200:
                continue
            for pod in json.loads(body)["items"]:
                pod_uid = pod["metadata"]["uid"]
                phase = pod.get("status", {}).get("phase")
                if pod_uid in self._seen or pod["metadata"].get("deletionTimestamp"):
                    continue
                if phase in ("Succeeded", "Failed"):
                    self._seen.add(pod_uid)
                    self.errors.append(
                        f"pod {namespace}/{pod['metadata']['name']} of hook Job {job['metadata']['name']} "
                        f"ended {phase} without being run here (is it labelled {COMPONENT_LABEL}={HOOK_POD}?)"
                    )
                elif phase == "Running":
                    self._seen.add(pod_uid)
                    self._run(job, pod, annotations[HOOK])

    def _run(self, job: dict[str, Any], pod: dict[str, Any], events: str) -> None:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        spec = pod["spec"]
        container = spec["containers"][0]
        command = [*container.get("command", []), *container.get("args", [])]
        run = HookRun(
            namespace,
            job["metadata"]["name"],
            tuple(events.split(",")),
            name,
            spec.get("serviceAccountName", "default"),
            command,
            self.observe() if self.observe is not None else None,
        )
        self.runs.append(run)
        started, clock = _now(), time.monotonic()
        if len(spec["containers"]) != 1 or not command or command[0] != "quorum":
            run.returncode, run.output = 127, f"the hook kubelet runs one `quorum` container, not {command}"
        else:
            extra = [
                a
                for prefix, args in self.extra_args.items()
                if tuple(command[: len(prefix)]) == prefix
                for a in args
            ]
            kubeconfig = _token_kubeconfig(
                self.instance, namespace, run.account, self.instance.layout.root / f"hook-{name}.kubeconfig"
            )
            env = {
                **os.environ,
                **{e["name"]: e["value"] for e in container.get("env", []) if "value" in e},
                "PYTHONPATH": str(REPO_ROOT),
                "KUBECONFIG": str(kubeconfig),
            }
            deadline = job["spec"].get("activeDeadlineSeconds") or 300
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "quorum", *command[1:], *extra],
                    capture_output=True,
                    text=True,
                    cwd=REPO_ROOT,
                    env=env,
                    timeout=min(deadline, 300),
                    check=False,
                )
                run.returncode, run.output = done.returncode, done.stdout + done.stderr
            except subprocess.TimeoutExpired as err:
                run.returncode, run.output = 137, f"killed after {err.timeout:.0f}s"
        self._end(pod, run.returncode, started)
        run.seconds = time.monotonic() - clock

    def _end(self, pod: dict[str, Any], code: int, started: str) -> None:
        """The pod's status as a kubelet writes it when its only container exits with `code`."""
        finished = _now()
        conditions = [
            {**c, "status": "False", "reason": "PodCompleted", "lastTransitionTime": finished}
            if c.get("type") in ("Ready", "ContainersReady")
            else c
            for c in pod.get("status", {}).get("conditions") or []
        ]
        container = pod["spec"]["containers"][0]
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started,
            "finishedAt": finished,
        }
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": conditions,
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container.get("image", ""),
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"terminated": terminated},
                }
            ],
        }
        self.instance.kubectl(
            "patch",
            "pod",
            pod["metadata"]["name"],
            f"--namespace={pod['metadata']['namespace']}",
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
        )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "route":
        sys.exit("usage: python -m devcluster.helm route BASE_URL  (a Helm post-renderer: stdin to stdout)")
    sys.stdout.write(route_webhooks(sys.stdin.read(), sys.argv[2]))
