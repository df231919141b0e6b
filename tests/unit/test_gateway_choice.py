"""Which provider a job's EXECUTE talks to, by configuration and credential mode."""

from __future__ import annotations

from engine.settings import Settings
from jobs.types import default_catalog
from runtime.wiring import gateway


def _settings(**env: str) -> Settings:
    return Settings.model_validate({"AIJOBS_ENV": "test", **env})


def test_offline_platform_jobs_use_the_synthetic_provider() -> None:
    g = gateway(_settings())
    quiz = default_catalog().get("quiz_generation")
    assert g.provider_for(quiz, "platform_key").name == "synthetic"
    assert g.model_for(quiz, "platform_key") == "synthetic"


def test_a_user_key_reaches_deepseek_even_offline() -> None:
    g = gateway(_settings())
    quiz = default_catalog().get("quiz_generation")
    provider = g.provider_for(quiz, "user_deepseek_key")
    assert provider.name == "deepseek"
    assert g.model_for(quiz, "user_deepseek_key") == "deepseek-chat"


def test_platform_key_or_base_url_selects_the_openai_compatible_provider() -> None:
    quiz = default_catalog().get("quiz_generation")
    assert gateway(_settings(DEEPSEEK_API_KEY="sk-x")).provider_for(quiz).name == "deepseek"
    local = gateway(_settings(AI_BASE_URL="http://127.0.0.1:9/v1", AI_MODEL="llama"))
    assert local.provider_for(quiz).name == "openai_compatible"
    assert local.model_for(quiz) == "llama"


def test_the_synthetic_job_type_never_calls_a_real_provider() -> None:
    g = gateway(_settings(DEEPSEEK_API_KEY="sk-x"))
    synthetic = default_catalog().get("synthetic")
    assert g.provider_for(synthetic, "platform_key").name == "synthetic"
