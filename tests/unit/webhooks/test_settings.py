from __future__ import annotations

from pathlib import Path

import pytest

from quorum.webhooks.settings import InterruptableOnGang, SettingsError, load_settings


def test_defaults() -> None:
    settings = load_settings({})
    assert "nvidia.com/gpu" in settings.accelerator_resources
    assert settings.reserved_label_domains == ("coreweave.cloud", "coreweave.com")
    assert "system:masters" not in settings.platform_groups


def test_file_then_environment_then_overrides(tmp_path: Path) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text("interruptable_on_gang: deny\nplatform_users: [a]\nport: 9000\n")
    env = {"QUORUM_WEBHOOKS_CONFIG": str(config), "QUORUM_WEBHOOKS_PLATFORM_USERS": '["b", "c"]'}
    settings = load_settings(env, port=9443)
    assert settings.interruptable_on_gang is InterruptableOnGang.DENY
    assert settings.platform_users == ("b", "c")
    assert settings.port == 9443


def test_unknown_variable_is_named() -> None:
    with pytest.raises(SettingsError, match="QUORUM_WEBHOOKS_PLATFORM_USER is not a setting"):
        load_settings({"QUORUM_WEBHOOKS_PLATFORM_USER": "x"})


def test_bad_values_and_files_are_explained(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="interruptable_on_gang"):
        load_settings({"QUORUM_WEBHOOKS_INTERRUPTABLE_ON_GANG": "maybe"})
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings({"QUORUM_WEBHOOKS_CONFIG": str(tmp_path / "missing.yaml")})
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n")
    with pytest.raises(SettingsError, match="mapping"):
        load_settings({"QUORUM_WEBHOOKS_CONFIG": str(bad)})
