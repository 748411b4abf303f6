"""Start and stop a named local control plane: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok on 127.0.0.1, with fake CKS-like nodes.

An instance lives in `.quorum/<name>/` (or `$QUORUM_STATE_DIR/<name>/`): certificates, etcd
data, logs, kubeconfigs of its identities, and `state.json` (the spec it was started with, its
ports and the PIDs it started). Processes run in their own sessions and outlive the command
that started them; `down()` stops exactly the recorded PIDs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from devcluster import slurm
from devcluster.build import BinaryCache, HelmCache, ensure_binaries
from devcluster.config import (
    ClusterSpec,
    Layout,
    Ports,
    admission_config,
    component_args,
    dumps,
    scheduler_config,
    spec_from_json,
)
from devcluster.identities import write_identities
from devcluster.kubeconfig import RestClient, probe, write_kubeconfig
from devcluster.nodes import NodePool, load_pool, node_groups, render_nodes, scale_pool
from devcluster.process import ProcessRecord, is_alive, spawn, stop, tail
from devcluster.webhooks import local_webhook_configurations
from quorum.core.gangs import VOLCANO_SCHEDULER, Placer
from quorum.install import (
    OPERATOR_SERVICE_ACCOUNT,
    PROTECTIVE_MANIFESTS,
    for_pod_admission,
    operator_username,
    render,
    render_files,
    static_admission,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = REPO_ROOT / "manifests"
# What `up` applies from manifests/ as is; the webhook configurations are rewritten to URLs on
# 127.0.0.1, and the Deployments are not applied (the processes run on this machine).
APPLIED_MANIFESTS = (
    "00-namespace.yaml",
    "10-rbac.yaml",
    "35-pod-defaults.yaml",  # not in the `webhooks` way of admitting pods (render_files leaves it out)
    "36-pod-policies.yaml",
    "40-gate-protection.yaml",
    "45-gang-backstop.yaml",
    "47-operator-fence.yaml",
    "48-tenant-fence.yaml",
)
CRDS = REPO_ROOT / "crds"
STAGES = Path(__file__).resolve().parent / "data" / "stages"
WEBHOOK_CONFIGURATIONS = "30-webhook-configurations.yaml"


class ClusterError(RuntimeError):
    """Starting or using an instance failed; the message says which component and why."""


def state_root() -> Path:
    return Path(os.environ.get("QUORUM_STATE_DIR", Path.cwd() / ".quorum")).resolve()


@dataclass(frozen=True)
class InstanceState:
    spec: ClusterSpec
    ports: Ports
    processes: list[ProcessRecord]
    started_at: float
    server: str

    def to_json(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_json(),
            "ports": self.ports.to_json(),
            "processes": [p.to_json() for p in self.processes],
            "started_at": self.started_at,
            "server": self.server,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InstanceState:
        return cls(
            spec=spec_from_json(data["spec"]),
            ports=Ports(**data["ports"]),
            processes=[ProcessRecord(p["name"], p["pid"], p["start_ticks"]) for p in data["processes"]],
            started_at=data["started_at"],
            server=data["server"],
        )


def free_ports(count: int) -> list[int]:
    """Ports the kernel has just handed out on 127.0.0.1 (held together, so all distinct)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


class Instance:
    """One named local cluster."""

    def __init__(
        self, name: str = "default", root: Path | None = None, binaries: BinaryCache | None = None
    ) -> None:
        self.name = name
        self.state_root = root or state_root()
        self.layout = Layout(self.state_root / name)
        self._binaries = binaries

    # -- state ---------------------------------------------------------------------------

    def state(self) -> InstanceState | None:
        try:
            return InstanceState.from_json(json.loads(self.layout.state_file.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def recorded_processes(self) -> list[ProcessRecord]:
        """The PIDs in state.json, read even when the rest of it is from an older quorum."""
        try:
            data = json.loads(self.layout.state_file.read_text())
            return [ProcessRecord(p["name"], p["pid"], p["start_ticks"]) for p in data["processes"]]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def _save(self, state: InstanceState) -> None:
        tmp = self.layout.state_file.with_suffix(".tmp")
        tmp.write_text(dumps(state.to_json()))
        tmp.replace(self.layout.state_file)

    def is_up(self) -> bool:
        state = self.state()
        if state is None or not state.processes:
            return False
        if not all(is_alive(p) for p in state.processes):
            return False
        status, _ = self.rest().get("/readyz")
        return status == 200

    def kubeconfig(self, who: str = "admin") -> Path:
        return self.layout.kubeconfig(who)

    def rest(self) -> RestClient:
        state = self.state()
        if state is None:
            raise ClusterError(f"instance {self.name!r} is not up")
        return RestClient(
            state.server,
            self.layout.pki / "ca.crt",
            self.layout.pki / "admin.crt",
            self.layout.pki / "admin.key",
        )

    @property
    def binaries(self) -> BinaryCache:
        """The binaries of the release this instance runs (or would run: the default)."""
        if self._binaries is None:
            state = self.state()
            spec = state.spec if state else ClusterSpec(name=self.name)
            self._binaries = ensure_binaries(BinaryCache(spec.release.pins))
        return self._binaries

    def wait_established(self, *targets: str) -> None:
        """`kubectl wait --for=condition=Established` on CRDs (files or `crd/<name>`). A CRD
        created a moment ago may have no status yet, and the wait then fails at once
        ("status.conditions accessor error"): it is asked again, for up to a minute."""
        deadline = time.monotonic() + 60
        while True:
            waited = self.kubectl(
                "wait", "--for=condition=Established", "--timeout=60s", *targets, check=False
            )
            if waited.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"CRDs not established: {waited.stderr.strip()}")
            time.sleep(0.5)

    def wait_type_checked(self, *policies: str, timeout: float = 60.0) -> bool:
        """Wait until the apiserver's type checker has written its status on the named
        ValidatingAdmissionPolicies (every one, without names): that write lands whenever the
        checker gets to it. Whether it had within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            listed = self.kubectl("get", "validatingadmissionpolicies", *policies, "-o", "json", check=False)
            items = json.loads(listed.stdout or "{}").get("items") or []
            if listed.returncode == 0 and all(
                (p.get("status") or {}).get("observedGeneration") == p["metadata"]["generation"]
                for p in items
            ):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)

    def kubectl(
        self, *args: str, who: str = "admin", input_text: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.binaries.path("kubectl")), f"--kubeconfig={self.kubeconfig(who)}", *args]
        proc = subprocess.run(
            argv, input=input_text, capture_output=True, text=True, check=False, timeout=300
        )
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    # -- up / down -----------------------------------------------------------------------

    def up(self, spec: ClusterSpec | None = None, log: Callable[[str], None] | None = None) -> InstanceState:
        """Start the instance and return its state. If it is up already: a no-op when `spec` is
        None or the spec it runs with; a restart with `spec` otherwise."""
        say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        if self.is_up():
            state = self.state()
            assert state is not None
            if spec is None or state.spec == spec:
                say(f"instance {self.name!r} is already up")
                return state
            say(f"instance {self.name!r} is up with other settings; restarting it")
        spec = spec or ClusterSpec(name=self.name)
        self.down(quiet=True)  # whatever is left of an earlier, broken start
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            # apt-get installs Slurm while Go builds the binaries (a first run's two longest waits)
            slurm_installed = pool.submit(slurm.ensure_installed) if spec.slurm else None
            if self._binaries is None or self._binaries.pins != spec.release.pins:
                self._binaries = ensure_binaries(BinaryCache(spec.release.pins))  # build first if needed
            if slurm_installed is not None:
                slurm_installed.result()
        started = time.monotonic()
        shutil.rmtree(self.layout.root, ignore_errors=True)
        for d in (self.layout.pki, self.layout.logs, self.layout.etcd_data):
            d.mkdir(parents=True)
        ports = Ports(*free_ports(11 if spec.slurm else 8))
        server = f"https://127.0.0.1:{ports.apiserver}"
        state = InstanceState(spec, ports, [], time.time(), server)
        self._save(state)
        write_identities(self.layout, self.name, server)
        (self.layout.root / "scheduler-config.yaml").write_text(
            scheduler_config(spec, self.layout.kubeconfig("scheduler"))
        )
        (self.layout.root / "admission-config.yaml").write_text(self._static_admission(spec))

        def start(component: str, healthy: Callable[[], bool], timeout: float = 60) -> None:
            record = self._spawn(component, state)
            state.processes.append(record)
            self._save(state)
            self._wait(component, record, healthy, timeout)

        try:
            start("etcd", lambda: probe(f"http://127.0.0.1:{ports.etcd_client}/health"))
            start("kube-apiserver", lambda: self.rest().get("/readyz", timeout=2)[0] == 200, 90)
            say(f"  apiserver ready at {server} ({time.monotonic() - started:.1f}s)")
            self._bootstrap(spec)
            if spec.webhooks:
                start("quorum-webhooks", lambda: probe(f"https://127.0.0.1:{ports.webhooks}/readyz"))
                self._register_webhooks(ports, spec)
            start(
                "kube-controller-manager",
                lambda: probe(f"https://127.0.0.1:{ports.controller_manager}/healthz"),
            )
            start("kube-scheduler", lambda: probe(f"https://127.0.0.1:{ports.scheduler}/healthz"))
            start("kwok", lambda: probe(f"http://127.0.0.1:{ports.kwok}/healthz"))
            count = self._create_nodes(spec)
            self._wait_nodes_ready(count, timeout=max(120, count / 20))  # 5,000 nodes: 250 s
            if spec.operator and spec.install_manifests:
                start("quorum-operator", lambda: probe(f"http://127.0.0.1:{ports.operator}/healthz"))
            if spec.slurm:
                self._start_slurm(spec, state, start)
                say(f"  Slurm up: SLURM_CONF={self.slurm_layout.conf} ({time.monotonic() - started:.1f}s)")
        except BaseException:
            self.down(quiet=True)
            raise
        if self.name == "default":
            self._write_env_files()
        say(
            f"instance {self.name!r} up in {time.monotonic() - started:.1f}s "
            f"({count} nodes, state in {self.layout.root})"
        )
        return state

    def down(self, quiet: bool = False) -> list[ProcessRecord]:
        """Stop exactly the processes this instance recorded; return the ones that were live."""
        processes = self.recorded_processes()
        if not processes and self.state() is None:
            if not quiet:
                print(f"instance {self.name!r} is not running", file=sys.stderr)
            return []
        live = [p for p in processes if is_alive(p)]
        has_slurm = any(p.name == "slurmctld" and is_alive(p) for p in processes)
        if has_slurm:
            slurm.cancel_everything(self.slurm_layout)
        killed = stop(processes)
        if self.slurm_layout.root.is_dir():
            for pid in slurm.leftover_job_processes(self.slurm_layout):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        state = self.state()
        if state is not None:
            self._save(InstanceState(state.spec, state.ports, [], state.started_at, state.server))
        else:
            self.layout.state_file.unlink(missing_ok=True)
        if not quiet:
            extra = f" (killed after grace period: {', '.join(killed)})" if killed else ""
            print(f"instance {self.name!r}: stopped {len(live)} processes{extra}", file=sys.stderr)
        return live

    def stop_component(self, component: str, grace_seconds: float = 10.0) -> None:
        """Stop one component (tests: the webhook server or the scheduler is down);
        `start_component` restarts it on the same port."""
        state = self.state()
        assert state is not None
        stop([p for p in state.processes if p.name == component], grace_seconds)

    def signal_component(self, component: str, signum: signal.Signals) -> None:
        """Send `signum` to one recorded component (tests: SIGSTOP makes a hung server, which
        costs each caller its full timeout, as a wedged or partitioned one does; SIGCONT ends it)."""
        state = self.state()
        assert state is not None
        for record in state.processes:
            if record.name == component and is_alive(record):
                os.kill(record.pid, signum)

    def adopt(self, record: ProcessRecord) -> None:
        """Record a process started beside the instance (e.g. a second scheduler), so that
        `down()` stops it with the rest."""
        state = self.state()
        assert state is not None
        self._save(
            InstanceState(state.spec, state.ports, [*state.processes, record], state.started_at, state.server)
        )

    def start_component(self, component: str, timeout: float = 60) -> None:
        state = self.state()
        assert state is not None
        record = self._spawn(component, state)
        processes = [p for p in state.processes if p.name != component] + [record]
        self._save(InstanceState(state.spec, state.ports, processes, state.started_at, state.server))
        url = {
            "quorum-sunk-scheduler": f"http://127.0.0.1:{state.ports.sunk}/healthz",
            "quorum-webhooks": f"https://127.0.0.1:{state.ports.webhooks}/readyz",
            "quorum-operator": f"http://127.0.0.1:{state.ports.operator}/healthz",
            "kube-scheduler": f"https://127.0.0.1:{state.ports.scheduler}/healthz",
        }[component]
        self._wait(component, record, lambda: probe(url), timeout)

    def upgrade(self, kubernetes: str, log: Callable[[str], None] | None = None) -> InstanceState:
        """Move a running instance to another Kubernetes minor in place, as a platform upgrades a
        control plane: stop the scheduler, controller-manager, apiserver and etcd; start them
        from the new release's binaries with its gates and runtime-config, on the same data and
        ports. Nodes (kwok), quorum and the workloads keep running throughout."""
        say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        state = self.state()
        if state is None or not self.is_up():
            raise ClusterError(f"instance {self.name!r} is not up")
        spec = dataclasses.replace(state.spec, kubernetes=kubernetes, feature_gates=None, runtime_config=None)
        self._binaries = ensure_binaries(BinaryCache(spec.release.pins))
        order = ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")
        stop([p for name in order for p in state.processes if p.name == name])
        kept = [p for p in state.processes if p.name not in order]
        state = InstanceState(spec, state.ports, kept, state.started_at, state.server)
        self._save(state)
        ports = state.ports
        (self.layout.root / "scheduler-config.yaml").write_text(
            scheduler_config(spec, self.layout.kubeconfig("scheduler"))
        )
        (self.layout.root / "admission-config.yaml").write_text(self._static_admission(spec))
        healthy: dict[str, Callable[[], bool]] = {
            "etcd": lambda: probe(f"http://127.0.0.1:{ports.etcd_client}/health"),
            "kube-apiserver": lambda: self.rest().get("/readyz", timeout=2)[0] == 200,
            "kube-controller-manager": lambda: probe(f"https://127.0.0.1:{ports.controller_manager}/healthz"),
            "kube-scheduler": lambda: probe(f"https://127.0.0.1:{ports.scheduler}/healthz"),
        }
        for component in reversed(order):
            record = self._spawn(component, state)
            state.processes.append(record)
            self._save(state)
            self._wait(component, record, healthy[component], 90)
        say(f"instance {self.name!r} now runs Kubernetes {spec.release.pins.kubernetes}")
        return state

    # -- steps ---------------------------------------------------------------------------

    @property
    def slurm_layout(self) -> slurm.SlurmLayout:
        return slurm.SlurmLayout(self.layout.root / "slurm")

    def _start_slurm(self, spec: ClusterSpec, state: InstanceState, start: Callable[..., None]) -> None:
        """munged, slurmctld, one slurmd per node, slurmrestd, then quorum-sunk-scheduler with its
        own ServiceAccount's token, under its fence (manifests/optional/sunk-scheduler.yaml)."""
        ports, layout = state.ports, self.slurm_layout
        nodes = render_nodes(self._pool(spec))
        slurm_nodes = slurm.slurm_nodes(nodes, free_ports(len(nodes)), self._node_groups(spec))
        slurm.prepare(layout, slurm_nodes, ports.slurmctld, f"http://127.0.0.1:{ports.sunk}")
        sock = layout.munge_socket
        start("munged", lambda: sock.exists())
        start("slurmctld", lambda: slurm.run(layout, "scontrol", "ping", timeout=5).returncode == 0)
        for node in slurm_nodes:
            record = self._spawn(f"slurmd:{node.name}", state)
            state.processes.append(record)
        self._save(state)
        slurm.wait_registered(layout, slurm_nodes)
        start(
            "slurmrestd",
            lambda: probe(f"http://127.0.0.1:{ports.slurmrestd}/openapi/v3") or _answers(ports.slurmrestd),
        )
        self._sunk_identity(spec)
        start("quorum-sunk-scheduler", lambda: probe(f"http://127.0.0.1:{ports.sunk}/readyz"))

    def _sunk_identity(self, spec: ClusterSpec) -> None:
        docs = [
            d for d in yaml.safe_load_all(render_files(["optional/sunk-scheduler.yaml"], spec.namespace)) if d
        ]
        # Its identity and its fence (the Deployment, Service and NetworkPolicy are for a cluster;
        # here it runs as a local process).
        kinds = (
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        )
        rights = [d for d in docs if d["kind"] in kinds]
        self.kubectl(
            "apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": rights})
        )
        token = self.kubectl(
            "create", "token", "quorum-sunk-scheduler", f"--namespace={spec.namespace}", "--duration=720h"
        ).stdout.strip()
        state = self.state()
        assert state is not None
        write_kubeconfig(
            self.layout.kubeconfig("quorum-sunk-scheduler"),
            server=state.server,
            ca_pem=(self.layout.pki / "ca.crt").read_bytes(),
            user=f"system:serviceaccount:{spec.namespace}:quorum-sunk-scheduler",
            token=token,
            namespace=spec.namespace,
        )

    def _spawn(self, component: str, state: InstanceState) -> ProcessRecord:
        if component in ("munged", "slurmctld", "slurmrestd") or component.startswith("slurmd:"):
            layout = self.slurm_layout
            argv = slurm.daemon_argv(component, layout, state.ports.slurmrestd)
            env = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"} | slurm.env(layout)
            if component == "slurmrestd":
                env["SLURM_JWT"] = "daemon"  # slurmrestd authenticates its clients' tokens
            log = layout.logs / f"{component.replace(':', '-')}.out"
            return spawn(component, argv, log, self.layout.root, env)
        binaries = self.binaries
        binary = Path(sys.executable) if component.startswith("quorum-") else binaries.path(component)
        argv = component_args(
            component,
            state.spec,
            state.ports,
            self.layout,
            binary,
            kwok_stages(binaries.stages_dir),
        )
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
            # What the Deployments set: the operator's namespace, and quorum's identity.
            "QUORUM_OPERATOR_NAMESPACE": state.spec.namespace,
            "QUORUM_WEBHOOKS_OPERATOR_USERS": json.dumps([operator_username(state.spec.namespace)]),
            "QUORUM_WEBHOOKS_COSCHEDULER_NAMES": json.dumps(list(state.spec.coschedulers)),
            "QUORUM_OPERATOR_COSCHEDULER_NAMES": ",".join(state.spec.coschedulers),
            "QUORUM_WEBHOOKS_PLACEMENT": state.spec.placement,
            "QUORUM_OPERATOR_PLACEMENT": state.spec.placement,
        }
        if component == "quorum-sunk-scheduler":
            layout = self.slurm_layout
            env.update(slurm.env(layout))
            env.update(
                {
                    "QUORUM_SUNK_SLURM_URL": f"http://127.0.0.1:{state.ports.slurmrestd}",
                    "QUORUM_SUNK_SLURM_JWT_KEY_FILE": str(layout.jwt_key),
                    "QUORUM_SUNK_HOOK_URL": f"http://127.0.0.1:{state.ports.sunk}",
                    "QUORUM_SUNK_HOOK_TOKEN_FILE": str(layout.hook_token),
                    "QUORUM_SUNK_SLURM_HOOK_TOKEN_PATH": str(layout.hook_token),
                    "QUORUM_SUNK_SLURM_KILL_WAIT_SECONDS": str(slurm.KILL_WAIT_SECONDS),
                    "QUORUM_SUNK_NAMESPACES": layout.sunk_namespaces.read_text(),
                }
            )
        return spawn(component, argv, self.layout.log(component), self.layout.root, env)

    def _register_webhooks(self, ports: Ports, spec: ClusterSpec) -> None:
        text = (MANIFESTS / WEBHOOK_CONFIGURATIONS).read_text()
        manifest = for_pod_admission(
            render(text, spec.namespace, coschedulers=spec.coschedulers, placement=Placer(spec.placement)),
            spec.pod_admission,
        )
        ca_pem = (self.layout.root / "webhooks-pki" / "ca.crt").read_bytes()
        configs = local_webhook_configurations(manifest, f"https://127.0.0.1:{ports.webhooks}", ca_pem)
        self.kubectl(
            "apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": configs})
        )

    def _wait(
        self, component: str, record: ProcessRecord, healthy: Callable[[], bool], timeout: float
    ) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not is_alive(record):
                reason = "exited during start-up"
                break
            if healthy():
                return
            if time.monotonic() > deadline:
                reason = f"not healthy after {timeout:.0f}s"
                break
            time.sleep(0.2)
        log = self.layout.log(component)
        raise ClusterError(f"{component} {reason}; last lines of {log}:\n{tail(log, 25)}")

    def _bootstrap(self, spec: ClusterSpec) -> None:
        """RBAC of the dev identities; quorum's own namespace, ServiceAccounts and RBAC; and a
        kubeconfig with the operator ServiceAccount's token, so quorum runs locally with exactly
        the rights it has in a cluster."""
        bootstrap = resources.files("devcluster").joinpath("data/bootstrap.yaml").read_text()
        self.kubectl("apply", "-f", "-", input_text=bootstrap)
        if not (spec.install_manifests and MANIFESTS.is_dir()):
            return
        self.kubectl("apply", "-f", str(CRDS))
        created = [CRDS / "scheduler-plugins"] + (
            [CRDS / "volcano"] if VOLCANO_SCHEDULER in spec.coschedulers else []
        )
        for crds in created:  # where absent, as the chart does
            create_if_absent = self.kubectl("create", "-f", str(crds), check=False)
            if create_if_absent.returncode != 0 and "AlreadyExists" not in create_if_absent.stderr:
                raise ClusterError(f"kubectl create -f {crds} failed: {create_if_absent.stderr}")
        for crds in (CRDS, *created):  # each directory's own files (`wait -f DIR` reads below it too)
            files = [f"--filename={f}" for f in sorted(crds.glob("*.yaml"))]
            self.wait_established(*files)
        applied = [m for m in APPLIED_MANIFESTS if not (spec.static == "all" and m in PROTECTIVE_MANIFESTS)]
        self.kubectl(
            "apply",
            "-f",
            "-",
            input_text=render_files(
                applied,
                spec.namespace,
                pod_admission=spec.pod_admission,
                coschedulers=spec.coschedulers,
                placement=Placer(spec.placement),
            ),
        )
        token = self.kubectl(
            "create",
            "token",
            OPERATOR_SERVICE_ACCOUNT,
            f"--namespace={spec.namespace}",
            "--duration=720h",
        ).stdout.strip()
        state = self.state()
        assert state is not None
        write_kubeconfig(
            self.layout.kubeconfig("quorum-operator"),
            server=state.server,
            ca_pem=(self.layout.pki / "ca.crt").read_bytes(),
            user=operator_username(spec.namespace),
            token=token,
            namespace=spec.namespace,
        )

    def _static_admission(self, spec: ClusterSpec) -> str:
        """Write the policies the apiserver loads from disk (none, quorum's self-protection, or
        its protective policies too) and return the AdmissionConfiguration that names them."""
        files = static_admission(
            spec.static if spec.install_manifests else "off", spec.namespace, placement=Placer(spec.placement)
        )
        if not files:
            return admission_config()
        directory = self.layout.static_admission
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (directory / name).write_text(text)
        return admission_config(directory)

    @staticmethod
    def _pool(spec: ClusterSpec) -> NodePool:
        pool = load_pool(spec.pool_file)
        return scale_pool(pool, spec.pool_size) if spec.pool_size is not None else pool

    def _node_groups(self, spec: ClusterSpec) -> dict[str, str]:
        return node_groups(self._pool(spec))

    def _create_nodes(self, spec: ClusterSpec) -> int:
        """Register the pool's nodes as the platform identity (like CKS's node lifecycle); with
        Slurm, every node is a Slurm node, labelled `quorum.dev/slurm-node=true` (what the
        DaemonSet warning of quorum-webhooks looks for), and GPU nodes also show SUNK's
        `sunk.coreweave.com/accelerator` (seed 002)."""
        nodes = render_nodes(self._pool(spec))
        if spec.slurm:
            for node in nodes:
                node["metadata"].setdefault("labels", {})[slurm.SLURM_NODE_LABEL] = "true"
                capacity = node["status"]["capacity"]
                if "nvidia.com/gpu" in capacity:
                    capacity[slurm.ACCELERATOR] = capacity["nvidia.com/gpu"]
                    node["status"]["allocatable"] = dict(capacity)
        items = json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes})
        self.kubectl("create", "-f", "-", "-o", "name", who="platform", input_text=items)
        return len(nodes)

    def _wait_nodes_ready(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        ready = 0
        while time.monotonic() < deadline:
            nodes = self.rest().get_json("/api/v1/nodes")["items"]
            ready = sum(1 for n in nodes if node_is_ready(n))
            if ready >= count:
                return
            time.sleep(0.5)
        log = self.layout.log("kwok")
        raise ClusterError(
            f"only {ready} of {count} nodes became Ready in {timeout:.0f}s; "
            f"last lines of {log}:\n{tail(log, 25)}"
        )

    def _write_env_files(self) -> None:
        shutil.copyfile(self.kubeconfig("admin"), self.state_root / "kubeconfig")
        (self.state_root / "kubeconfig").chmod(0o600)
        bindir = self.binaries.bin_dir
        helm_dir = HelmCache().bin_dir  # on PATH once built (`make build`, or the chart's tests)
        slurm_conf = self.slurm_layout.conf if self.slurm_layout.conf.exists() else None
        write_env_file(self.state_root, [bindir, helm_dir], slurm_conf)


def write_env_file(state_root: Path, tools: Sequence[Path], slurm_conf: Path | None = None) -> Path:
    """`<state_root>/env`, to source: KUBECONFIG (`<state_root>/kubeconfig`) and PATH with
    `<state_root>/bin` and the `tools` directories. In `<state_root>/bin`, `quorum` and
    `kubectl-quorum` (so `kubectl quorum ...` works) run this checkout with this Python: the venv
    does not install quorum."""
    commands = state_root / "bin"
    commands.mkdir(parents=True, exist_ok=True)
    for name in ("quorum", "kubectl-quorum"):
        wrapper = commands / name
        wrapper.write_text(
            "#!/bin/sh\n"
            "# written by devcluster: the quorum command of this checkout\n"
            f"PYTHONPATH={shlex.quote(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
            "export PYTHONPATH\n"
            f'exec {shlex.quote(sys.executable)} -m quorum "$@"\n'
        )
        wrapper.chmod(0o755)
    path = ":".join(shlex.quote(str(d)) for d in [commands, *tools])
    env = state_root / "env"
    env.write_text(
        "# source me: . .quorum/env\n"
        f"export KUBECONFIG={shlex.quote(str(state_root / 'kubeconfig'))}\n"
        f'export PATH={path}:"$PATH"\n'
        + (f"export SLURM_CONF={shlex.quote(str(slurm_conf))}\n" if slurm_conf is not None else "")
    )
    return env


def _answers(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:port (slurmrestd answers 401 to an
    unauthenticated probe)."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def kwok_stages(built: Path) -> list[Path]:
    """quorum's Stage files (data/stages/), and kwok's own where quorum has none of the name."""
    ours = {p.name: p for p in STAGES.glob("*.yaml")}
    return sorted([*ours.values(), *(p for p in built.glob("*.yaml") if p.name not in ours)])


# Taints the node lifecycle controller keeps on a node until it has seen the node Ready; it
# lifts them a moment (longer under load) after kwok reports Ready.
CONDITION_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


def node_is_ready(node: dict[str, Any]) -> bool:
    """Ready, and no longer tainted not-ready: until then no scheduler and no plan uses it."""
    conditions = node.get("status", {}).get("conditions") or []
    taints = node.get("spec", {}).get("taints") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions) and not any(
        t.get("key") in CONDITION_TAINTS for t in taints
    )
