"""Layering: quorum.core and the SUNK scheduler's decisions (quorum/sunk/model.py) are pure (no
I/O libraries, no other quorum layer but core)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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
    "quorum.devcluster",
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


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("import kopf\nfrom kubernetes_asyncio import client\n")
    assert imports_of(sample) == {"kopf", "kubernetes_asyncio"}
