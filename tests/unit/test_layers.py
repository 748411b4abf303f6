"""Layering: quorum.core and the SUNK scheduler's decisions (quorum/sunk/model.py) are pure (no
I/O libraries, no other quorum layer but core)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from quorum.core.record import DECISIONS

QUORUM = Path(__file__).resolve().parents[2] / "quorum"
CORE = QUORUM / "core"
PURE = [*sorted(CORE.rglob("*.py")), QUORUM / "sunk" / "model.py"]
FORBIDDEN = (
    "kopf",
    "kubernetes_asyncio",
    "aiohttp",
    "requests",
    "urllib",
    "socket",
    "subprocess",
    "quorum.k8s",
    "quorum.operator",
    "quorum.webhooks",
    "devcluster",
    "quorum.sunk",
)


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", PURE, ids=lambda p: p.name)
def test_core_imports_no_io(module: Path) -> None:
    bad = {n for n in imports_of(module) if any(n == f or n.startswith(f + ".") for f in FORBIDDEN)}
    assert not bad, f"{module.name} imports {sorted(bad)}; quorum.core must stay pure"


@pytest.mark.parametrize("module", sorted(QUORUM.rglob("*.py")), ids=lambda p: str(p.relative_to(QUORUM)))
def test_the_runtime_package_needs_no_dev_tool(module: Path) -> None:
    """What ships in the image imports neither the local control plane nor the tests."""
    bad = {n for n in imports_of(module) if n.split(".")[0] in ("devcluster", "tests")}
    assert not bad, f"{module.relative_to(QUORUM)} imports {sorted(bad)}, which the image does not have"


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("import kopf\nfrom kubernetes_asyncio import client\n")
    assert imports_of(sample) == {"kopf", "kubernetes_asyncio"}


OPERATOR = QUORUM / "operator"
STATUS_WRITES = {"patch_gang_status", "patch_gang_status_if", "patch_group_status", "apply_group_status"}
# A preemption's victims (delete_victim, a victim Job's suspension): preemption.py, by the
# preemption it recorded first; every other delete or suspension: recovery.py.
DESTRUCTIVE = {"delete_pod", "delete_victim", "set_job_suspend"}


def calls_of(path: Path, names: set[str]) -> set[str]:
    """Which of `names` the module calls as an attribute (`api.delete_pod(...)`)."""
    return {
        node.func.attr
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names
    }


@pytest.mark.parametrize("module", sorted(OPERATOR.glob("*.py")), ids=lambda p: p.name)
def test_one_writer_of_a_gangs_status_and_one_place_that_deletes(module: Path) -> None:
    # manual.py, `quorum release`, writes its record through status.py's GangRecords too.
    if module.name != "status.py":
        assert not calls_of(module, STATUS_WRITES), "a Gang's or group's status is written by status.py alone"
    allowed = {
        "recovery.py": {"delete_pod", "set_job_suspend"},
        "preemption.py": {"delete_victim", "set_job_suspend"},
    }.get(module.name, set())
    assert calls_of(module, DESTRUCTIVE) <= allowed, (
        "pods are deleted and Jobs suspended by recovery.py, and victims by preemption.py, alone"
    )


def test_the_writer_check_sees_a_call(tmp_path: Path) -> None:
    stray = tmp_path / "stray.py"
    stray.write_text("async def f(api):\n    await api.patch_gang_status('ns', 'g', {})\n")
    assert calls_of(stray, STATUS_WRITES) == {"patch_gang_status"}


@pytest.mark.parametrize("module", sorted(OPERATOR.glob("*.py")), ids=lambda p: p.name)
def test_only_the_recorder_posts_events(module: Path) -> None:
    if module.name != "events.py":
        assert not calls_of(module, {"post_event"}), "Events go through events.EventRecorder"


DECISION_FIELDS = set(DECISIONS)  # the Gang status fields that record decisions


def decision_reads(path: Path) -> list[str]:
    """Where a module reads a decision field of a Gang's status by its JSON name: `x.get("admission")`
    or `x["admission"]` (a dict literal that writes one is not a read)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            key = node.args[0] if node.args else None
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        if isinstance(key, ast.Constant) and key.value in DECISION_FIELDS:
            found.append(f"{path.name}:{getattr(node, 'lineno', 0)} reads {key.value!r}")
    return found


@pytest.mark.parametrize(
    "module", sorted([*OPERATOR.glob("*.py"), QUORUM / "commands" / "uninstall.py"]), ids=lambda p: p.name
)
def test_decisions_are_read_through_the_typed_record(module: Path) -> None:
    """What quorum decided about a gang is read as `quorum.core.record` types (`GangRecords.record`,
    `GangRecord.of`), parsed in one place, never as a dict by the field's name."""
    assert not decision_reads(module), "read the Gang's decisions through quorum.core.record"


def test_the_decision_read_check_sees_one(tmp_path: Path) -> None:
    stray = tmp_path / "stray.py"
    stray.write_text(
        "def f(gang):\n    return (gang.get('status') or {}).get('admission'), gang['recovery']\n"
    )
    assert len(decision_reads(stray)) == 2


@pytest.mark.parametrize("module", sorted(OPERATOR.glob("*.py")), ids=lambda p: p.name)
def test_a_module_that_removes_pods_records_its_decision_conditionally(module: Path) -> None:
    """Deleting, evicting or suspending follows a record that succeeds only if the Gang still holds
    the decision it acts on (`GangRecords.record_if`, or `patch_recovery(..., expect=...)`): a
    module that makes such calls makes conditional records too."""
    if not calls_of(module, DESTRUCTIVE):
        return
    conditional = calls_of(module, {"record_if"}) or any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "patch_recovery"
        and any(k.arg == "expect" for k in node.keywords)
        for node in ast.walk(ast.parse(module.read_text()))
    )
    assert conditional, f"{module.name} removes pods without a conditional record"


def signals_of(path: Path) -> set[str]:
    """Calls that signal a process by its PID, or end this one: `os.kill(...)`, `os.abort()`,
    `signal.raise_signal(...)` (a child's `proc.kill()` on a timeout is not one)."""
    return {
        f"{node.func.value.id}.{node.func.attr}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and (node.func.value.id, node.func.attr)
        in {("os", "kill"), ("os", "killpg"), ("os", "abort"), ("signal", "raise_signal")}
    }


@pytest.mark.parametrize("module", sorted(QUORUM.rglob("*.py")), ids=lambda p: str(p.relative_to(QUORUM)))
def test_nothing_that_ships_kills_a_process(module: Path) -> None:
    """No test hook in what ships: the crash tests kill the operator by its PID from outside
    (tests.kube.kill_after)."""
    assert not signals_of(module), f"{module.relative_to(QUORUM)} signals a process"


def test_the_signal_check_sees_one(tmp_path: Path) -> None:
    stray = tmp_path / "stray.py"
    stray.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\nproc.kill()\n")
    assert signals_of(stray) == {"os.kill"}


def test_no_setting_is_a_test_hook() -> None:
    from quorum.operator.settings import OperatorSettings
    from quorum.sunk.settings import SunkSettings
    from quorum.webhooks.settings import WebhookSettings

    for settings in (OperatorSettings, WebhookSettings, SunkSettings):
        hooks = [name for name in settings.model_fields if name.startswith("test")]
        assert not hooks, f"{settings.__name__} has test hooks {hooks}"


def reads_of_the_gang_label(path: Path) -> int:
    """Lookups keyed by GANG_LABEL: `labels.get(GANG_LABEL)`, `labels[GANG_LABEL]`."""
    found = 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            found += any(isinstance(a, ast.Name) and a.id == "GANG_LABEL" for a in node.args[:1])
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            found += isinstance(node.slice, ast.Name) and node.slice.id == "GANG_LABEL"
    return found


@pytest.mark.parametrize("module", sorted(OPERATOR.glob("*.py")), ids=lambda p: p.name)
def test_the_operator_reads_a_pods_gang_through_the_store(module: Path) -> None:
    """A pod's gang is `Store.gang_of(pod)`: its label, or its Gang's legacy name (an upgrade
    splits no gang); gangs.py alone reads the label."""
    if module.name != "gangs.py":
        assert reads_of_the_gang_label(module) == 0, "read the pod's gang with Store.gang_of"


def test_the_gang_label_check_sees_a_read(tmp_path: Path) -> None:
    stray = tmp_path / "stray.py"
    stray.write_text("def f(pod, labels):\n    return pod['labels'][GANG_LABEL], labels.get(GANG_LABEL)\n")
    assert reads_of_the_gang_label(stray) == 2


STORE_TABLES = {"pods", "nodes", "groups", "gangs", "pdbs", "composites"}


def store_writes(path: Path) -> list[int]:
    """Lines that write a Store table directly (`store.gangs[k] = ...`, `store.pods.pop(...)`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            targets = [t.value for t in targets if isinstance(t, ast.Subscript)]
        elif isinstance(node, ast.Delete):
            targets = [t.value for t in node.targets if isinstance(t, ast.Subscript)]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"pop", "clear", "update", "setdefault", "popitem"}
        ):
            targets = [node.func.value]
        found += [
            t.lineno
            for t in targets
            if isinstance(t, ast.Attribute)
            and t.attr in STORE_TABLES
            and isinstance(t.value, ast.Attribute | ast.Name)
            and (t.value.attr if isinstance(t.value, ast.Attribute) else t.value.id) == "store"
        ]
    return found


@pytest.mark.parametrize("module", sorted(OPERATOR.glob("*.py")), ids=lambda p: p.name)
def test_the_store_is_written_by_its_watches_and_its_assumptions_alone(module: Path) -> None:
    """Kueue's cache: what the watches show, and this process's own writes assumed through
    `Store.assume_*` (gangs.py) until they show them; no other module writes it."""
    if module.name != "gangs.py":
        assert not store_writes(module), f"{module.name} writes the Store at lines {store_writes(module)}"


def test_the_store_write_check_sees_one(tmp_path: Path) -> None:
    stray = tmp_path / "stray.py"
    stray.write_text(
        "def f(self, k, g):\n    self.store.gangs[k] = g\n    self.store.pods.pop(k)\n    x.gangs[k] = g\n"
    )
    assert store_writes(stray) == [2, 3]
