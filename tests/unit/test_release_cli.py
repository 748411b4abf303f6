"""`quorum release`: bad input is refused with a message that says what to write instead."""

from __future__ import annotations

import pytest

from quorum.cli import main


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["release", "--reason", "x"], "name one gang as <namespace>/<gang>, or pass --all"),
        (
            ["release", "ml/pg-a", "--all", "--reason", "x"],
            "name one gang as <namespace>/<gang>, or pass --all",
        ),
        (["release", "pg-a", "--reason", "x"], "'pg-a' is not <namespace>/<gang> (e.g. ml/pg-train)"),
        (["release", "ml/", "--reason", "x"], "'ml/' is not <namespace>/<gang>"),
    ],
)
def test_bad_targets_are_refused_with_a_hint(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert says in capsys.readouterr().out


def test_a_reason_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["release", "ml/pg-a"])
    assert "--reason" in capsys.readouterr().err
