"""`python -m devcluster ...`: build, start, stop and inspect local control-plane instances, and
run the demos. A development tool: it needs a checkout of the repository and is not in the image."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from devcluster import controllers, demo, jobset
from devcluster.build import BinaryCache, BuildError, ensure_binaries, ensure_helm
from devcluster.cluster import ClusterError, Instance, state_root
from devcluster.config import ClusterSpec
from devcluster.process import is_alive
from devcluster.versions import DEFAULT_RELEASE, RELEASES


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster", description=__doc__)
    cmds = parser.add_subparsers(dest="command", required=True)
    _add_instance_commands(cmds)
    demo.add_parser(cmds)
    jobset.add_parser(cmds)
    controllers.add_parser(cmds)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


def _add_instance_commands(cmds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    build = cmds.add_parser("build", help="build and cache etcd, Kubernetes, kwok and helm binaries")
    build.add_argument(
        "--all",
        action="store_true",
        help=f"every Kubernetes minor ({', '.join(RELEASES)}), not only the default",
    )
    up = cmds.add_parser("up", help="start an instance (a no-op if it is up)")
    up.add_argument("--name", default="default")
    up.add_argument(
        "--kubernetes",
        choices=sorted(RELEASES),
        default=None,
        help=f"the Kubernetes minor to run (default {DEFAULT_RELEASE}; env QUORUM_K8S)",
    )
    up.add_argument("--size", type=int, default=None, help="scale the node pool to ~N nodes")
    up.add_argument("--pool", type=Path, default=None, help="a node-pool file")
    up.add_argument("--qps", type=float, default=None, help="scheduler/controller client QPS")
    up.add_argument("--burst", type=int, default=None)
    up.add_argument(
        "--slurm", action="store_true", help="with a real Slurm cluster and quorum-sunk-scheduler"
    )
    down = cmds.add_parser("down", help="stop an instance's recorded processes")
    down.add_argument("--name", default="default")
    down.add_argument("--all", action="store_true", help="every instance under .quorum/")
    status = cmds.add_parser("status", help="show instances and their processes")
    status.add_argument("--name", default=None)
    for command in (build, up, down, status):
        command.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.command == "build":
            for name in RELEASES if args.all else [DEFAULT_RELEASE]:
                print(ensure_binaries(BinaryCache(RELEASES[name].pins)).bin_dir)
            print(ensure_helm().parent)  # the chart's tests and `make release-manifests` use it
        elif args.command == "up":
            # No option: keep a running instance as it is (`make up` twice is a no-op).
            spec = None
            chosen = (args.pool, args.size, args.qps, args.burst, args.kubernetes)
            if any(v is not None for v in chosen) or args.slurm:
                spec = ClusterSpec(
                    name=args.name,
                    kubernetes=args.kubernetes or DEFAULT_RELEASE,
                    pool_file=args.pool,
                    pool_size=args.size,
                    slurm=args.slurm,
                )
                if args.qps is not None:
                    spec = dataclasses.replace(spec, client_qps=args.qps)
                if args.burst is not None:
                    spec = dataclasses.replace(spec, client_burst=args.burst)
            Instance(args.name).up(spec)
        elif args.command == "down":
            names = _instances() if args.all else [args.name]
            for name in names:
                Instance(name).down()
        elif args.command == "status":
            return _status([args.name] if args.name else _instances())
    except (BuildError, ClusterError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def _instances() -> list[str]:
    root = state_root()
    return sorted(p.parent.name for p in root.glob("*/state.json")) if root.is_dir() else []


def _status(names: list[str]) -> int:
    if not names:
        print("no instances")
    for name in names:
        instance = Instance(name)
        state = instance.state()
        if state is None:
            print(f"{name}: no state")
            continue
        up = instance.is_up()
        age = time.time() - state.started_at
        print(f"{name}: {'up' if up else 'down'}  {state.server}  started {age:.0f}s ago")
        for p in state.processes:
            print(f"  {p.name:<24} pid {p.pid:<8} {'alive' if is_alive(p) else 'dead'}")
    return 0
