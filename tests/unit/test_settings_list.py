"""The settings an operator owns: at most 55 (besides other issues' new ones), the names
operators and existing checks set kept, retention in two settings, `aijobs settings` (table and
JSON) listing exactly what docs/operations.md "Settings" documents, secrets never shown, and no
environment variable read by name outside the list."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field, SecretStr, ValidationError

from engine.retention_days import DEFAULT_RETENTION_DAYS, parse_retention_days
from engine.settings import Settings
from runtime import cli
from runtime.settings_cli import cmd_settings, is_secret, items, mask_passwords

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 55
# Names other open issues add on top of the 55 (each helper adds its own here).
# Settings the other open issues of this round add (each names its own).
OTHER_ISSUES: set[str] = {
    "AI_BATCH_MAX_LINES",
    "AI_BATCH_MAX_BYTES",
    "CONSOLE_SESSION_TTL_S",
    "JWT_ORG_CLAIM",
    "JWT_TEAMS_CLAIM",
    "AI_CAPACITY_RESERVE",
    # Structured output and guardrails (docs/fallback.md, docs/operations.md "Guardrails").
    "AI_STRUCTURED_OUTPUT",
    "AI_STRUCTURED_DOWNGRADE_TTL_S",
    "AI_PII_PHONE_REGION",
    "AI_MODERATION_MODEL",
    "AI_MODERATION_BASE_URL",
    "AI_MODERATION_API_KEY",
    # Flow control (docs/api.md "Flow control", docs/admin.md "Operator pauses").
    "AI_DEBOUNCE_MAX_DELAY_MS",
    "AI_DEFAULT_TTL_S",
    "AI_RESUME_RATE",
}
KEPT = {
    *"AI_BATCH_WINDOW_S AI_BATCH_POLL_S PROVIDER_BREAKER_FAILURES PROVIDER_BREAKER_COOLDOWN_S "
    "RETRY_AFTER_MAX_S AI_HEARTBEAT_TIMEOUT_MS RECONCILE_INTERVAL_S AI_CHUNK_INPUT_TOKENS "
    "AI_CHUNK_CONCURRENCY SSE_PING_S WORKER_METRICS_PORT TEMPORAL_METRICS_PORT METRICS_HOST "
    "SCHEDULE_MIN_INTERVAL_S CORS_ALLOW_ORIGINS USER_KEY_ALLOWED_BASE_URLS TEMPORAL_UI_URL "
    "RELAY_POLL_INTERVAL_S AI_INTERACTIVE_CONCURRENCY AI_BACKGROUND_CONCURRENCY AI_MODEL_LIMITS "
    "AI_MODEL_PRICES QUOTA_MAX_COST_USD_PER_DAY QUOTA_MAX_COST_USD_PER_MONTH "
    "QUOTA_MAX_JOBS_PER_MONTH API_RATE_LIMIT_PER_MINUTE API_RATE_LIMIT_BURST DATABASE_URL "
    "DATABASE_DIRECT_URL TEMPORAL_ADDRESS TEMPORAL_NAMESPACE AIJOBS_ENV JWT_SECRET JWT_ISSUER "
    "JWT_AUDIENCE CREDENTIAL_ENCRYPTION_KEY DEEPSEEK_API_KEY AI_BASE_URL AI_MODEL AI_FALLBACKS "
    "QUOTA_MAX_ACTIVE_JOBS QUOTA_MAX_JOBS_PER_DAY DATA_RETENTION_DAYS LOG_LEVEL "
    "USER_DISPATCH_WINDOW STAGE_INTERNAL_ATTEMPTS RETENTION_DAYS".split()
}
REPLACED_RETENTION = [f"{kind.upper()}_RETENTION_DAYS" for kind in DEFAULT_RETENTION_DAYS]
SECRETS = {
    "JWT_SECRET": "jwt-" + "s3cr3t" * 8,
    "DEEPSEEK_API_KEY": "sk-platform-s3cr3t-key",
    "CREDENTIAL_ENCRYPTION_KEY": "k1:" + "QUJD" * 11,
    "AI_FALLBACKS": json.dumps(
        [{"model": "m", "baseUrl": "http://fb.example/v1", "apiKey": "sk-fallback-s3cr3t"}]
    ),
}
SECRET_TEXTS = ["s3cr3t", "QUJDQUJD", "pa55-w0rd"]


def names() -> list[str]:
    return [item.name for item in items(Settings.model_validate({"AIJOBS_ENV": "test"}))]


def documented() -> list[str]:
    """The first column of docs/operations.md's "## Settings" table."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", section, flags=re.MULTILINE)


def test_the_docs_table_lists_exactly_the_settings_the_command_prints() -> None:
    listed = names()
    assert len(listed) == len(set(listed))
    assert sorted(documented()) == sorted(listed)
    assert len(set(listed) - OTHER_ISSUES) <= LIMIT
    assert KEPT <= set(listed)


def test_retention_is_two_settings() -> None:
    assert [n for n in names() if "RETENTION" in n] == ["DATA_RETENTION_DAYS", "RETENTION_DAYS"]


def test_retention_days_merge_over_the_defaults() -> None:
    s = Settings.model_validate({"RETENTION_DAYS": '{"usage": 800, "webhook": 1}'})
    assert s.retention_days == {**DEFAULT_RETENTION_DAYS, "usage": 800, "webhook": 1}
    assert Settings.model_validate({}).retention_days == DEFAULT_RETENTION_DAYS
    assert parse_retention_days({"outbox": 3})["outbox"] == 3


@pytest.mark.parametrize(
    "value",
    ['{"usages": 3}', '{"usage": 0}', '{"usage": -1}', '{"usage": 1.5}', '{"usage": "3"}',
     '{"usage": true}', "[1]", "7", "{usage: 3"],
)  # fmt: skip
def test_a_bad_retention_days_is_an_error_naming_it(value: str) -> None:
    with pytest.raises(ValidationError) as info:
        Settings.model_validate({"RETENTION_DAYS": value})
    [error] = info.value.errors()
    assert error["loc"] == ("RETENTION_DAYS",)
    assert "RETENTION_DAYS" in error["msg"]


def test_a_bad_retention_days_stops_a_process_in_one_line(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    environ.setenv("AIJOBS_ENV", "development")
    environ.setenv("RETENTION_DAYS", '{"usage": 0}')
    with pytest.raises(SystemExit) as info:
        cli.cmd_token(argparse.Namespace(user="u", admin=False, ttl=60))
    assert info.value.code == 2
    assert capsys.readouterr().err == (
        "aijobs token: invalid configuration: RETENTION_DAYS: usage must be a whole number of "
        "days, at least 1 (got '0')\n"
    )


@pytest.mark.parametrize("name", [*REPLACED_RETENTION, "SNAPSHOT_TTL_DAYS"])
def test_a_replaced_retention_setting_stops_every_process(
    name: str, environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    environ.setenv("AIJOBS_ENV", "development")
    environ.setenv(name, "5")
    with pytest.raises(SystemExit) as info:
        cli.cmd_token(argparse.Namespace(user="u", admin=False, ttl=60))
    assert info.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"aijobs token: refusing to start: {name} is no longer read: set ")
    wanted = "DATA_RETENTION_DAYS" if name == "SNAPSHOT_TTL_DAYS" else "RETENTION_DAYS"
    assert f"set {wanted} instead" in line
    # Empty is unset, as for every setting.
    environ.setenv(name, "")
    assert cli.cmd_token(argparse.Namespace(user="u", admin=False, ttl=60)) == 0


@pytest.mark.parametrize("command", [["api"], ["worker"], ["relay"], ["reconcile"], ["dev"]])
def test_every_entry_point_refuses_a_replaced_retention_setting(command: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.cli", *command],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT), "WEBHOOK_RETENTION_DAYS": "3"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"aijobs {command[0]}: refusing to start: WEBHOOK_RETENTION_DAYS")
    assert "RETENTION_DAYS=" in line


def _settings_json(environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    assert cmd_settings(argparse.Namespace(json=True)) == 0
    out = capsys.readouterr().out
    for text in SECRET_TEXTS:
        assert text not in out
    return json.loads(out)


def test_the_json_lists_every_setting_typed_with_its_source_and_default(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In production without any secret (no startup check runs), then with some set."""
    environ.setenv("QUOTA_MAX_ACTIVE_JOBS", "7")
    environ.setenv("RETENTION_DAYS", '{"usage": 800}')
    environ.setenv("DATABASE_URL", "postgresql://aijobs:pa55-w0rd@db.example:5432/aijobs")
    environ.setenv("SSE_PING_S", "")  # empty: unset
    for name, value in SECRETS.items():
        environ.setenv(name, value)
    body = _settings_json(environ, capsys)
    assert list(body) == ["settings"]
    rows = {row["name"]: row for row in body["settings"]}
    assert len(rows) == len(body["settings"]) == len(names())
    for row in body["settings"]:
        assert list(row) == ["name", "value", "default", "source", "secret"]
    assert rows["QUOTA_MAX_ACTIVE_JOBS"] == {
        "name": "QUOTA_MAX_ACTIVE_JOBS", "value": 7, "default": 50, "source": "env",
        "secret": False,
    }  # fmt: skip
    set_here = {"QUOTA_MAX_ACTIVE_JOBS", "RETENTION_DAYS", "DATABASE_URL", *SECRETS}
    assert {n for n, row in rows.items() if row["source"] == "env"} == set_here
    assert {n for n, row in rows.items() if row["secret"]} >= set(SECRETS)
    for name in SECRETS:
        assert (rows[name]["value"], rows[name]["default"]) == ("***", None)
    assert rows["DATABASE_URL"]["value"] == "postgresql://aijobs:***@db.example:5432/aijobs"
    assert rows["RETENTION_DAYS"]["value"] == {**DEFAULT_RETENTION_DAYS, "usage": 800}
    assert rows["RETENTION_DAYS"]["default"] == DEFAULT_RETENTION_DAYS
    # Typed, and the defaults of the running environment (production: unset AIJOBS_ENV).
    assert rows["AIJOBS_ENV"] == {
        "name": "AIJOBS_ENV", "value": "production", "default": "production",
        "source": "default", "secret": False,
    }  # fmt: skip
    assert rows["WORKER_METRICS_PORT"]["value"] == rows["WORKER_METRICS_PORT"]["default"] == 9464
    assert rows["WEBHOOK_ALLOW_PRIVATE"]["default"] is False
    assert rows["SSE_PING_S"]["value"] == 15.0 and rows["SSE_PING_S"]["source"] == "default"
    assert rows["JWT_ISSUER"]["value"] is None


def test_the_defaults_follow_the_running_environment(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    environ.setenv("AIJOBS_ENV", "development")
    rows = {row["name"]: row for row in _settings_json(environ, capsys)["settings"]}
    assert rows["AIJOBS_ENV"]["default"] == "production"
    assert (rows["AIJOBS_ENV"]["value"], rows["AIJOBS_ENV"]["source"]) == ("development", "env")
    assert rows["WORKER_METRICS_PORT"]["default"] == 0
    assert rows["WEBHOOK_ALLOW_PRIVATE"]["default"] is True


def test_the_table_shows_every_setting_and_no_secret(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    environ.setenv("QUOTA_MAX_ACTIVE_JOBS", "7")
    environ.setenv("DATABASE_URL", "postgresql://aijobs:pa55-w0rd@db.example:5432/aijobs")
    for name, value in SECRETS.items():
        environ.setenv(name, value)
    assert cmd_settings(argparse.Namespace(json=False)) == 0
    out = capsys.readouterr().out
    for text in SECRET_TEXTS:
        assert text not in out
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "VALUE", "DEFAULT", "SOURCE", "SECRET"]
    assert [line.split()[0] for line in lines[1:]] == names()
    quota = next(line.split() for line in lines if line.startswith("QUOTA_MAX_ACTIVE_JOBS "))
    assert quota == ["QUOTA_MAX_ACTIVE_JOBS", "7", "50", "env"]
    jwt = next(line.split() for line in lines if line.startswith("JWT_SECRET "))
    assert jwt == ["JWT_SECRET", "***", "-", "env", "yes"]


def test_the_command_runs_as_a_process_anywhere() -> None:
    """No database, no Temporal, production without its secrets: exit 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "settings", "--json"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT), "AIJOBS_ENV": "production"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["settings"]) == len(names())


def test_a_new_secret_field_is_a_secret() -> None:
    class More(Settings):
        moderation_key: SecretStr | None = Field(default=None, alias="SOME_MODERATION_API_KEY")
        marked: str = Field(default="", alias="MARKED", json_schema_extra={"secret": True})

    s = More.model_validate({"SOME_MODERATION_API_KEY": "mk-s3cr3t", "MARKED": "m-s3cr3t"})
    rows = {row.name: row for row in items(s)}
    assert rows["SOME_MODERATION_API_KEY"].secret and rows["MARKED"].secret
    assert rows["SOME_MODERATION_API_KEY"].value == rows["MARKED"].value == "***"
    assert not is_secret(More.model_fields["ai_model"])


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://u:pw@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u:p@ss/w,rd@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u@h/db?password=pw&sslmode=require", "postgresql://u@h/db?password=***&sslmode=require"),
        ("postgresql://h:5432/db", "postgresql://h:5432/db"),
        ("https://a.example,https://u:pw@b.example", "https://a.example,https://u:***@b.example"),
    ],
)  # fmt: skip
def test_a_password_in_a_url_is_masked(text: str, shown: str) -> None:
    assert mask_passwords(text) == shown


# ---- no variable read by name outside the list ---------------------------------------------

PACKAGES = ("engine", "db", "providers", "jobs", "workflows", "activities", "api", "runtime")
_READ = re.compile(
    r"""(?:environ\s*\[\s*|environ\.(?:get|setdefault|pop)\(\s*|getenv\(\s*)["']([A-Za-z0-9_]+)["']"""
)
ALSO_READ = {"AIJOBS_TOKEN", "AIJOBS_API_URL"}


def test_the_engine_reads_no_variable_by_name_outside_the_settings() -> None:
    allowed = set(names()) | ALSO_READ
    found = {
        (str(path.relative_to(ROOT)), name)
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        for name in _READ.findall(path.read_text())
        if name not in allowed and not name.startswith("OTEL_")
    }
    assert not found


def test_the_benches_change_constants_before_the_engine_reads_them() -> None:
    """bench/engine_cli.py, in a fresh process as the benches and the cluster test run it."""
    script = (
        "from bench.engine_cli import apply\n"
        "rest = apply(['activities.webhooks.POLL_INTERVAL_S=3600', 'engine.queues.LOCK_TTL_S=3',"
        " 'relay.fairness=false', 'relay.lock_ttl_s=5.0', '--', 'relay'])\n"
        "from engine.settings import Settings\n"
        "from engine.queues import LOCK_TTL_S\n"
        "from runtime.wiring import relay_config, webhook_config\n"
        "s = Settings.model_validate({'DATABASE_URL': 'postgresql://u@h/d'})\n"
        "r = relay_config(s)\n"
        "print(rest, webhook_config(s).poll_interval_s, LOCK_TTL_S, r.fairness, r.lock_ttl_s)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.split() == ["['relay']", "3600", "3", "False", "5.0"], proc.stderr
