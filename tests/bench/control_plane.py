"""Benchmark of the local control plane itself: start-up time and memory per component, at the
default pool and at 1,000 nodes. Bounded: two instances, each stopped after its measurement.

    make bench            # writes bench/results/<date>-control-plane.json and prints a table
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devcluster.cluster import Instance
from devcluster.config import ClusterSpec
from devcluster.process import ProcessRecord

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
SETTLE_SECONDS = 30  # let controllers and kwok reach steady state before reading memory


def rss_mib(record: ProcessRecord) -> float:
    for line in Path(f"/proc/{record.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(name: str, size: int | None) -> dict[str, Any]:
    instance = Instance(name)
    instance.down(quiet=True)
    started = time.monotonic()
    state = instance.up(ClusterSpec(name=name, pool_size=size), log=lambda _: None)
    cold = time.monotonic() - started
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "devcluster", "up", "--name", name],
        check=True,
        capture_output=True,
    )
    warm = time.monotonic() - started
    nodes = len(instance.rest().get_json("/api/v1/nodes")["items"])
    time.sleep(SETTLE_SECONDS)
    memory = {p.name: round(rss_mib(p), 1) for p in state.processes}
    instance.down(quiet=True)
    return {
        "instance": name,
        "nodes": nodes,
        "up_seconds": round(cold, 1),
        "up_again_seconds": round(warm, 2),
        "rss_mib": memory,
        "rss_total_mib": round(sum(memory.values()), 1),
    }


def main() -> int:
    runs = [measure("bench-default", None), measure("bench-1000", 1000)]
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    out = RESULTS / f"{stamp}-control-plane.json"
    out.write_text(json.dumps({"date": stamp, "runs": runs}, indent=2) + "\n")
    components = list(runs[0]["rss_mib"])
    print(
        "| nodes | `up` (s) | `up` again (s) | "
        + " | ".join(f"{c} RSS (MiB)" for c in components)
        + " | total (MiB) |"
    )
    print("|---" * (len(components) + 4) + "|")
    for r in runs:
        print(
            f"| {r['nodes']} | {r['up_seconds']} | {r['up_again_seconds']} | "
            + " | ".join(str(r["rss_mib"][c]) for c in components)
            + f" | {r['rss_total_mib']} |"
        )
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
