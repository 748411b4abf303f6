"""The README's install and uninstall blocks, as tests/integration/test_readme_install.py reads
them: both ways of installing and removing are found, and a README without the blocks fails
saying which marker is missing."""

from __future__ import annotations

import pytest

from tests.integration.test_readme_install import README, ReadmeCommands, readme_commands

BLOCKS = """
<!-- install: a test runs these -->
```sh
helm upgrade -i quorum charts/quorum -n quorum-system --create-namespace   # a comment
kubectl label namespace quorum-system pod-security.kubernetes.io/enforce=restricted
kubectl apply --server-side -f dist/quorum.yaml   # or this
```

text between

<!-- uninstall -->
```sh
# a comment line
helm uninstall quorum -n quorum-system
quorum uninstall
```
"""


def test_the_blocks_split_into_the_helm_way_and_the_one_manifest() -> None:
    assert readme_commands(BLOCKS) == ReadmeCommands(
        helm_install=[
            "helm upgrade -i quorum charts/quorum -n quorum-system --create-namespace   # a comment",
            "kubectl label namespace quorum-system pod-security.kubernetes.io/enforce=restricted",
        ],
        manifest_install=["kubectl apply --server-side -f dist/quorum.yaml   # or this"],
        helm_uninstall=["helm uninstall quorum -n quorum-system"],
        manifest_uninstall=["quorum uninstall"],
    )


def test_the_readme_has_both_ways_of_both() -> None:
    commands = readme_commands(README.read_text())
    assert commands.helm_install[0].startswith("helm upgrade -i quorum charts/quorum")
    assert commands.manifest_install and commands.helm_uninstall and commands.manifest_uninstall


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        (BLOCKS.replace("<!-- install: a test runs these -->", ""), "<!-- install -->"),
        (BLOCKS.replace("<!-- uninstall -->", "<!-- removal -->"), "<!-- uninstall -->"),
        (BLOCKS.replace("kubectl apply --server-side -f dist/quorum.yaml   # or this\n", ""), "one-manifest"),
        (BLOCKS.replace("quorum uninstall\n", ""), "one-manifest uninstall"),
    ],
)
def test_a_readme_without_them_fails_saying_what_is_missing(text: str, complaint: str) -> None:
    with pytest.raises(AssertionError, match=complaint):
        readme_commands(text)
