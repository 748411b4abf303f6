"""`make test-integrations`: the ML controllers whose gang dialects quorum reads, built from their
Go modules (devcluster.controllers) and run beside quorum on an instance of their own,
`integrations`, where quorum also takes Volcano's dialect (chart value schedulers.volcano).

The `cluster` fixture here replaces the shared one for these tests: the `api`, `namespace` and
`test_pool` fixtures of tests/conftest.py then work on this instance. Not collected by
`make test` (tests/conftest.py leaves this directory out unless QUORUM_INTEGRATIONS is set).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devcluster.cluster import Instance
from devcluster.config import ClusterSpec
from devcluster.controllers import CONTROLLERS, Running, ensure_built, start, stop_all
from quorum.core.gangs import COSCHEDULER_NAMES, VOLCANO_SCHEDULER

INSTANCE = "integrations"


@pytest.fixture(scope="session")
def cluster() -> Iterator[Instance]:
    instance = Instance(INSTANCE)
    binaries = {name: ensure_built(c, instance.binaries) for name, c in CONTROLLERS.items()}
    instance.up(ClusterSpec(name=INSTANCE, coschedulers=(*COSCHEDULER_NAMES, VOLCANO_SCHEDULER)))
    running: list[Running] = []
    try:
        for name, controller in CONTROLLERS.items():
            running.append(start(instance, controller, binaries[name]))
        yield instance
    finally:
        stop_all(instance, running)
        instance.down()
