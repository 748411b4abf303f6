"""A real Slurm cluster beside a local instance (`make up SLURM=1`): Debian's munge, slurmctld,
slurmrestd and one `slurmd -N <node>` per kwok node, all on 127.0.0.1 and all recorded by PID
like the other processes, so `make down` stops them.

Slurm node names are the Kubernetes node names; GPUs are GRES (`gpu:8`, empty files stand in for
the devices); each node-pool group is a partition, and beside it a `<group>-high` partition on the
same nodes with a higher PriorityTier: `PreemptType=preempt/partition_prio` with
`PreemptMode=CANCEL` is how a higher-priority job preempts (QOS preemption needs slurmdbd, which
this cluster does not run). The prolog and epilog call quorum's hook API (the SUNK scheduler,
`quorum/sunk/hooks.py`). What the files contain is decided by pure functions of the nodes and
ports (`slurm_conf`, `gres_conf`, `hook_script`), unit-tested without starting anything.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quorum.core.quantity import parse_quantity
from quorum.sunk.model import drain_reason

PACKAGES = ("munge", "slurmctld", "slurmd", "slurmrestd", "slurm-client", "slurm-wlm-jwt-plugin")
BINARIES = ("munged", "slurmctld", "slurmd", "slurmrestd", "sinfo", "scontrol")
JWT_PLUGIN = Path("/usr/lib/x86_64-linux-gnu/slurm-wlm/auth_jwt.so")
HIGH_SUFFIX = "-high"
KILL_WAIT_SECONDS = 30  # slurm.conf KillWait; the SUNK scheduler's --slurm-kill-wait must match
REST_API = "v0.0.38"  # the newest OpenAPI plugin of Slurm 22.05
ACCELERATOR = "sunk.coreweave.com/accelerator"
SLURM_NODE_LABEL = "quorum.dev/slurm-node"  # quorum-webhooks' `sunk_node_label` default


class SlurmError(RuntimeError):
    """Installing or starting Slurm failed; the message says which part and why."""


@dataclass(frozen=True)
class SlurmNode:
    name: str
    cpus: int
    memory_mib: int
    gpus: int
    partition: str
    port: int
    down_reason: str | None = None  # cordoned or not in production: drained from the start


def slurm_nodes(
    nodes: Sequence[dict[str, Any]], ports: Sequence[int], groups: Mapping[str, str]
) -> list[SlurmNode]:
    """One Slurm node per Kubernetes node (a rendered Node dict), each with its slurmd port, in
    the partition named after its pool group (`groups`: node name -> group)."""
    found = []
    for node, port in zip(nodes, ports, strict=True):
        meta = node["metadata"]
        capacity = node["status"]["capacity"]
        found.append(
            SlurmNode(
                name=meta["name"],
                cpus=max(1, int(parse_quantity(capacity.get("cpu", "1")))),
                memory_mib=max(1, int(parse_quantity(capacity.get("memory", "1Gi")) // 2**20)),
                gpus=int(parse_quantity(capacity.get("nvidia.com/gpu", "0"))),
                partition=groups.get(meta["name"], "default"),
                port=port,
                down_reason=drain_reason(node),
            )
        )
    return found


@dataclass(frozen=True)
class SlurmLayout:
    """Where the Slurm cluster of an instance keeps its files: `.quorum/<name>/slurm/`."""

    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def jwt_key(self) -> Path:
        return self.root / "jwt.key"

    @property
    def hook_token(self) -> Path:
        """The SUNK hook API's shared secret: the scheduler's copy and the Slurm nodes' at once."""
        return self.root / "hook.token"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def sunk_namespaces(self) -> Path:
        """The SUNK scheduler's allow-list (QUORUM_SUNK_NAMESPACES) for this cluster."""
        return self.root / "sunk-namespaces.json"

    def device(self, node: str, index: int) -> Path:
        return self.root / "dev" / node / f"nvidia{index}"


def slurm_conf(
    nodes: Sequence[SlurmNode], layout: SlurmLayout, ctld_port: int, hook_url: str, hostname: str
) -> str:
    r = layout.root
    lines = [
        "# Written by quorum (devcluster/slurm.py) for one local instance.",
        "ClusterName=quorum",
        f"SlurmctldHost={hostname}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={layout.munge_socket}",
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters=jwt_key={layout.jwt_key}",
        "CredType=cred/munge",
        f"StateSaveLocation={r / 'state'}",
        f"SlurmdSpoolDir={r / 'spool' / '%n'}",
        f"SlurmctldPidFile={r / 'slurmctld.pid'}",
        f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={layout.logs / 'slurmctld.log'}",
        f"SlurmdLogFile={layout.logs / 'slurmd-%n.log'}",
        # One machine plays every node: no cgroups, and slurmd takes each node's size from here.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SlurmdParameters=config_overrides",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "GresTypes=gpu",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=5,bf_interval=5",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=CANCEL",
        f"KillWait={KILL_WAIT_SECONDS}",
        "MinJobAge=600",  # ended jobs stay visible for 10 min: the scheduler reads why they ended
        "ReturnToService=2",
        "PrologFlags=Alloc",  # the prolog runs on every node of an allocation, before the script
        "PrologEpilogTimeout=120",
        f"Prolog={r / 'prolog.sh'}",
        f"Epilog={r / 'epilog.sh'}",
        "DebugFlags=NO_CONF_HASH",
    ]
    for n in nodes:
        gres = f" Gres=gpu:{n.gpus}" if n.gpus else ""
        lines.append(
            f"NodeName={n.name} NodeAddr=127.0.0.1 NodeHostname={hostname} Port={n.port} "
            f"CPUs={n.cpus} RealMemory={n.memory_mib}{gres} Feature={n.name} State=UNKNOWN"
        )
    partitions: dict[str, list[str]] = {}
    for n in nodes:
        partitions.setdefault(n.partition, []).append(n.name)
    for i, (name, members) in enumerate(partitions.items()):
        listed = ",".join(members)
        default = " Default=YES" if i == 0 else ""
        lines.append(f"PartitionName={name} Nodes={listed}{default} PriorityTier=1 MaxTime=INFINITE State=UP")
        lines.append(
            f"PartitionName={name}{HIGH_SUFFIX} Nodes={listed} PriorityTier=10 MaxTime=INFINITE State=UP"
        )
    return "\n".join(lines) + "\n"


def sunk_namespaces(nodes: Sequence[SlurmNode]) -> dict[str, Any]:
    """What the local cluster's namespaces may name in Slurm: every partition (each pool group's
    and its `-high` one), and no account, QOS or reservation (there is no slurmdbd)."""
    pools = {n.partition for n in nodes}
    return {"*": {"partitions": sorted(pools | {p + HIGH_SUFFIX for p in pools})}}


def gres_conf(nodes: Sequence[SlurmNode], layout: SlurmLayout) -> str:
    """GRES `gpu` needs File= lines, or slurmd reports fewer GPUs than configured (INVAL)."""
    lines = []
    for n in nodes:
        if n.gpus:
            files = layout.root / "dev" / n.name / f"nvidia[0-{n.gpus - 1}]"
            lines.append(f"NodeName={n.name} Name=gpu File={files}")
    return "\n".join(lines) + "\n"


def hook_script(hook_url: str, event: str, token: Path) -> str:
    """The prolog or epilog: ask quorum's hook API to lock (prolog) or unlock (epilog) this node
    for this job, and wait for its answer. A prolog that fails makes Slurm requeue the job and
    drain the node, so the node is never used unlocked; curl retries for a while first, so a
    restarting scheduler does not drain nodes. The token reaches curl on stdin, not in argv."""
    return (
        "#!/bin/sh\n"
        "# Written by quorum: node locking through the SUNK scheduler's hook API.\n"
        f"printf 'Authorization: Bearer %s\\n' \"$(cat {token})\" | "
        f"curl --silent --show-error --fail --max-time 110 --retry 20 --retry-delay 2 "
        f"--retry-all-errors -H @- -X POST "
        f'"{hook_url}/hooks/{event}?job=$SLURM_JOB_ID&node=$SLURMD_NODENAME"\n'
    )


def missing() -> list[str]:
    """The Slurm programs this machine lacks."""
    absent = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if not JWT_PLUGIN.exists():
        absent.append(str(JWT_PLUGIN))
    return absent


def ensure_installed() -> None:
    """Install Debian's Slurm 22.05 and munge with apt-get if any part is missing (no services
    are started: the packages' own units stay off, the instance runs its own daemons)."""
    if not missing():
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=900)
    if proc.returncode != 0:
        update = subprocess.run(
            ["apt-get", "update"], capture_output=True, text=True, check=False, timeout=600
        )
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=900)
        if proc.returncode != 0:
            raise SlurmError(
                f"apt-get install {' '.join(PACKAGES)} failed: {proc.stderr[-2000:]}{update.stderr}"
            )
    if still := missing():
        raise SlurmError(f"after apt-get install, still missing: {', '.join(still)}")


def prepare(layout: SlurmLayout, nodes: Sequence[SlurmNode], ctld_port: int, hook_url: str) -> None:
    """Write every file the daemons read: keys, slurm.conf, gres.conf, prolog, epilog, devices."""
    hostname = os.uname().nodename
    for d in ("state", "spool", "dev", "logs"):
        (layout.root / d).mkdir(parents=True, exist_ok=True)
    layout.munge_dir.mkdir(mode=0o711, exist_ok=True)
    layout.munge_dir.chmod(0o711)  # munged insists that the socket's directory is not writable by others
    key = layout.munge_dir / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    layout.jwt_key.write_bytes(os.urandom(32))
    layout.jwt_key.chmod(0o600)
    layout.hook_token.write_text(secrets.token_hex(32))
    layout.hook_token.chmod(0o600)
    for n in nodes:
        (layout.root / "spool" / n.name).mkdir(parents=True, exist_ok=True)
        for i in range(n.gpus):
            path = layout.device(n.name, i)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
    layout.conf.write_text(slurm_conf(nodes, layout, ctld_port, hook_url, hostname))
    (layout.root / "gres.conf").write_text(gres_conf(nodes, layout))
    layout.sunk_namespaces.write_text(json.dumps(sunk_namespaces(nodes)))
    for event in ("prolog", "epilog"):
        script = layout.root / f"{event}.sh"
        script.write_text(hook_script(hook_url, event, layout.hook_token))
        script.chmod(0o755)


def daemon_argv(component: str, layout: SlurmLayout, rest_port: int) -> list[str]:
    """argv of `munged`, `slurmctld`, `slurmrestd` or `slurmd:<node>`, in the foreground."""
    conf = str(layout.conf)
    if component == "munged":
        m = layout.munge_dir
        return [
            "munged", "--foreground", "--force", f"--socket={layout.munge_socket}",
            f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
            f"--seed-file={m / 'munged.seed'}", f"--log-file={layout.logs / 'munged.log'}",
        ]  # fmt: skip
    if component == "slurmctld":
        return ["slurmctld", "-D", "-i", "-f", conf]
    if component == "slurmrestd":
        # Only the v0.0.38 plugin: the dbv0.0.38 one needs slurmdbd. slurmrestd will not run as
        # root; it drops to nobody once its socket is open.
        return [
            "slurmrestd", "-f", conf, "-a", "rest_auth/jwt", "-s", f"openapi/{REST_API}",
            "-u", "nobody", "-g", "nogroup", f"127.0.0.1:{rest_port}",
        ]  # fmt: skip
    if component.startswith("slurmd:"):
        return ["slurmd", "-D", "-N", component.split(":", 1)[1], "-f", conf]
    raise ValueError(f"unknown Slurm component {component!r}")


def env(layout: SlurmLayout) -> dict[str, str]:
    """What a Slurm command needs to reach this cluster (`.quorum/env` exports it too)."""
    return {"SLURM_CONF": str(layout.conf)}


def run(layout: SlurmLayout, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), capture_output=True, text=True, check=False, timeout=timeout,
        env={k: v for k, v in os.environ.items() if k != "SLURM_JWT"} | env(layout),
    )  # fmt: skip


def ready_nodes(layout: SlurmLayout) -> dict[str, str]:
    """Slurm's state of each node (`sinfo`), {} if slurmctld does not answer."""
    proc = run(layout, "sinfo", "--noheader", "--Node", "--format=%N %T", timeout=10)
    if proc.returncode != 0:
        return {}
    return dict(line.split()[:2] for line in proc.stdout.splitlines() if len(line.split()) >= 2)


def wait_registered(layout: SlurmLayout, nodes: Sequence[SlurmNode], timeout: float = 90) -> None:
    """Until every slurmd has registered (its node is no longer `unknown`/`down`); a node whose
    Kubernetes node is cordoned is drained in Slurm once it has."""
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = ready_nodes(layout)
        if states and all(not _unregistered(states.get(n.name, "unknown")) for n in nodes):
            break
        time.sleep(0.5)
    else:
        bad = {
            n.name: states.get(n.name, "missing")
            for n in nodes
            if _unregistered(states.get(n.name, "unknown"))
        }
        raise SlurmError(f"Slurm nodes not registered after {timeout:.0f}s: {bad}")
    for n in nodes:
        if n.down_reason:
            proc = run(
                layout, "scontrol", "update", f"NodeName={n.name}", "State=DRAIN", f"Reason={n.down_reason}"
            )
            if proc.returncode != 0:
                raise SlurmError(f"scontrol update NodeName={n.name} State=DRAIN failed: {proc.stderr}")


def _unregistered(state: str) -> bool:
    return state.rstrip("*~#!%$@^-").lower() in ("unknown", "down", "inval", "missing")


def cancel_everything(layout: SlurmLayout) -> None:
    """Before the daemons stop: kill every job, so no job script outlives the instance
    (slurmstepd runs each job in a session of its own, which stopping slurmd leaves alone)."""
    run(layout, "scancel", "--signal=KILL", "--full", "--user=root", timeout=15)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        proc = run(layout, "squeue", "--noheader", "--states=RUNNING,COMPLETING,CONFIGURING", timeout=10)
        if proc.returncode != 0 or not proc.stdout.strip():
            return
        time.sleep(0.5)


def leftover_job_processes(layout: SlurmLayout) -> list[int]:
    """PIDs of job scripts (and their slurmstepd) of this instance still running after its
    daemons stopped: processes whose command line names a file under this instance's spool."""
    spool = str(layout.root / "spool")
    found: list[int] = []
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            cmdline = (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if spool in cmdline:
                found.append(int(proc_dir.name))
                stat = (proc_dir / "stat").read_text()
                parent = int(stat[stat.rindex(")") + 2 :].split()[1])
                comm = Path(f"/proc/{parent}/comm").read_text().strip()
                if comm.startswith("slurmstepd"):
                    found.append(parent)
        except (OSError, ValueError):
            continue
    return sorted(set(found))
