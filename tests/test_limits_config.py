"""The limits' settings (issue 19): `RINGLET_MAX_CONCURRENT_RUNS`, `RINGLET_PROVIDER_RATE_LIMITS` and an
agent's `max_concurrent_runs`, and the errors that name what is wrong and how to fix it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from ringlet import ConfigError
from ringlet.agent.config import load_config
from ringlet.server.catalog import Catalog
from ringlet.server.http.settings import RateLimit, ServerSettings, parse_rate_limits


def test_limits_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServerSettings().max_concurrent_runs is None
    assert ServerSettings().provider_rate_limits == {}
    monkeypatch.setenv("RINGLET_MAX_CONCURRENT_RUNS", "5")
    monkeypatch.setenv("RINGLET_PROVIDER_RATE_LIMITS", "openai=10/1s, anthropic = 50/60s,gemini=2/m,local=1/0.5s")
    settings = ServerSettings.from_env()
    assert settings.max_concurrent_runs == 5
    assert settings.provider_rate_limits == {
        "openai": RateLimit(limit=10, period=1), "anthropic": RateLimit(limit=50, period=60),
        "gemini": RateLimit(limit=2, period=60), "local": RateLimit(limit=1, period=0.5)}
    assert ServerSettings.from_env(max_concurrent_runs=2).max_concurrent_runs == 2  # a flag wins


@pytest.mark.parametrize("raw", ["openai=10", "openai", "openai=0/1s", "openai=10/0s", "openai=10/1d",
                                 "=10/1s", "openai=ten/1s"])
def test_a_bad_rate_limit_names_the_variable_and_the_fix(raw: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_rate_limits(raw)
    assert str(err.value).startswith("RINGLET_PROVIDER_RATE_LIMITS: cannot read")
    assert "<provider>=<requests>/<period>" in str(err.value)
    assert "openai=10/1s,anthropic=50/60s" in str(err.value)


def test_a_provider_given_twice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGLET_PROVIDER_RATE_LIMITS", "openai=10/1s,openai=5/1s")
    with pytest.raises(ValidationError, match="RINGLET_PROVIDER_RATE_LIMITS: provider 'openai' is given twice"):
        ServerSettings.from_env()


def test_a_negative_global_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGLET_MAX_CONCURRENT_RUNS", "-1")
    with pytest.raises(ValidationError, match="max_concurrent_runs"):
        ServerSettings.from_env()


def test_an_agents_limit_is_read_and_checked(tmp_path: Path) -> None:
    agent = tmp_path / "solo"
    agent.mkdir()
    (agent / "config.yaml").write_text("instructions: hi\nmax_concurrent_runs: 1\n")
    assert load_config(agent / "config.yaml").max_concurrent_runs == 1
    assert Catalog.from_dir(tmp_path).get("solo").max_concurrent_runs == 1
    (agent / "config.yaml").write_text("instructions: hi\nmax_concurrent_runs: 0\n")
    with pytest.raises(ConfigError) as err:
        load_config(agent / "config.yaml")
    assert f"{agent / 'config.yaml'}:2:1: max_concurrent_runs: Input should be greater than or equal to 1" \
        in str(err.value)
    (agent / "config.yaml").write_text("instructions: hi\nmax_concurent_runs: 2\n")
    with pytest.raises(ConfigError, match="did you mean 'max_concurrent_runs'"):
        load_config(agent / "config.yaml")


def test_a_provider_rate_limit_on_sqlite_is_not_enforced_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    assert not ServerSettings(max_concurrent_runs=3).durable("sqlite")
    assert "enforced with engine 'dbos'" not in caplog.text  # concurrency limits hold in process
    assert not ServerSettings(provider_rate_limits="openai=3/1s").durable("sqlite")
    assert "RINGLET_PROVIDER_RATE_LIMITS is enforced with engine 'dbos' (PostgreSQL) only" in caplog.text
