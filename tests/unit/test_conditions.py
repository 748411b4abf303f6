"""The phase of a gang as quorum writes it, and as Volcano names it on a Volcano PodGroup."""

from __future__ import annotations

from quorum.core.conditions import VOLCANO_PHASES, phase


def test_every_phase_has_volcanos_name() -> None:
    """Held: Pending; released and binding: Inqueue; minMember running: Running; done:
    Completed; failed below minMember: Unknown (Volcano has no Failed)."""
    cases = [
        ({"members": 4, "succeeded": 0, "failed": 0, "running": 0, "released": 0}, "Pending"),
        ({"members": 4, "succeeded": 0, "failed": 0, "running": 0, "released": 4}, "Inqueue"),
        ({"members": 4, "succeeded": 0, "failed": 0, "running": 4, "released": 4}, "Running"),
        ({"members": 0, "succeeded": 4, "failed": 0, "running": 0, "released": 4}, "Completed"),
        ({"members": 1, "succeeded": 0, "failed": 3, "running": 1, "released": 4}, "Unknown"),
    ]
    assert [VOLCANO_PHASES[phase(counts, 4)] for counts, _ in cases] == [want for _, want in cases]
