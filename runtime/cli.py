"""`aijobs`: the commands a deployment runs, and `aijobs dev` for the whole stack on one machine."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pydantic import ValidationError

from engine.settings import ConfigurationError, Role, Settings
from runtime import operator_commands, settings_cli
from runtime.names import application_name
from runtime.settings_cli import validation_line

if TYPE_CHECKING:
    from runtime.telemetry import Telemetry

log = logging.getLogger("aijobs")


def _refuse(command: str, line: str) -> SystemExit:
    print(f"aijobs {command}: {line}", file=sys.stderr, flush=True)
    return SystemExit(2)


def _settings(role: Role, *, queues: Sequence[str] = ()) -> Settings:
    """Settings from the environment, checked for `role` before anything connects anywhere:
    a configuration that must not run exits with code 2 and one line on stderr."""
    try:
        s = Settings()
    except ValidationError as exc:
        raise _refuse(role, f"invalid configuration: {validation_line(exc)}") from None
    except ConfigurationError as exc:  # a removed setting is set
        raise _refuse(role, f"refusing to start: {exc}") from None
    problems: list[str] = []
    if role in ("api", "worker"):
        # Prices are read by the API (budgets) and the workers (usage rows): malformed ones
        # stop either in every environment, like a malformed keyring.
        from engine.offpeak import parse_windows
        from providers.pricing import PriceTable
        from runtime.wiring import form_policy, pii_region, price_problems

        try:
            PriceTable.from_settings(s)
            parse_windows(s.ai_offpeak_windows)  # AI_OFFPEAK_WINDOWS, likewise
            form_policy(s)  # AI_STRUCTURED_OUTPUT
            pii_region(s)  # AI_PII_PHONE_REGION
        except ValueError as exc:  # the message names the setting and the entry
            raise _refuse(role, f"invalid configuration: {exc}") from None
        problems = price_problems(s, role, queues)
    try:
        s.check_startup(role, queues=queues, also=problems)
    except ConfigurationError as exc:
        raise _refuse(role, str(exc)) from None
    keyring = s.credential_encryption_key
    if keyring is not None and role in ("api", "worker", "rotate-keys"):
        from providers.crypto import CredentialCipher

        try:
            CredentialCipher.from_setting(keyring.get_secret_value())
        except ValueError as exc:  # the message names the key id, never key material
            raise _refuse(role, f"refusing to start: CREDENTIAL_ENCRYPTION_KEY: {exc}") from None
    return s


def _startup(role: Role, *, queues: Sequence[str] = ()) -> Settings:
    """`_settings`, then what the role connects to (runtime/startup.py): a database or Temporal
    that does not answer within STARTUP_WAIT_S exits with code 2 and one line naming it."""
    s = _settings(role, queues=queues)
    from runtime.startup import reachability_problems

    problems = reachability_problems(s, role, application_name=application_name(role, queues))
    if problems:
        raise _refuse(role, f"refusing to start: {'; '.join(problems)}")
    return s


def _observability(s: Settings, role: Role, queues: Sequence[str] = ()) -> Telemetry:
    """Logs in the process's format, and its tracing from the OTEL_* variables (installed as
    the global tracer provider); refuses to start when the exporter cannot be built."""
    from prometheus_client import disable_created_metrics

    from runtime.logs import default_format, setup_logging
    from runtime.telemetry import service_name, tracing_from_env

    # No `<counter>_created` series next to every counter: half the series, nothing lost.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    name = service_name(role, queues)
    log_format = default_format(s.environment)
    setup_logging(s.log_level, process=name, log_format=log_format)
    try:
        telemetry = tracing_from_env(name)
    except ConfigurationError as exc:
        raise _refuse(role, str(exc)) from None
    telemetry.install_global()
    return telemetry


def _install_stop(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


# ---- commands ---------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    s = _startup("migrate")
    from db.migrate import upgrade

    # Its advisory lock is held by the session.
    upgrade(s.session_database_url, application_name=application_name("migrate"))
    print("migrations applied")
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    s = _settings("token")
    from api.auth import JwtConfig, issue_token

    config = JwtConfig.from_settings(s)
    if not 1 <= args.ttl <= config.max_ttl_s:
        raise _refuse("token", f"--ttl must be between 1 and {config.max_ttl_s} seconds (30 days)")
    org, teams = getattr(args, "org", None), getattr(args, "team", None) or []
    try:  # an --org or --team of another form than the API accepts is refused here
        print(
            issue_token(config, args.user, admin=args.admin, ttl_s=args.ttl, org=org, teams=teams)
        )
    except ValueError as exc:
        raise _refuse("token", str(exc)) from None
    return 0


def cmd_api(args: argparse.Namespace) -> int:
    s = _startup("api")
    import uvicorn

    from runtime.wiring import api_app

    telemetry = _observability(s, "api")
    app = api_app(s, application_name=application_name("api"))
    telemetry.instrument_app(app)
    try:
        # The event loop and HTTP parser are named, not "auto": a dev install that happens to
        # have uvloop/httptools (a test tool pulls them in) serves like the production image.
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level="warning",
            access_log=False,
            loop="asyncio",
            http="h11",
        )
    finally:
        telemetry.shutdown()
    return 0


async def _worker_main(s: Settings, queues: list[str], telemetry: Telemetry) -> None:
    from runtime.telemetry import start_metrics_server, temporal_runtime
    from runtime.wiring import build_parts, connect_temporal
    from runtime.worker import run_workers

    stop = asyncio.Event()
    _install_stop(asyncio.get_running_loop(), stop)
    _serve_metrics(s, start_metrics_server)
    parts = build_parts(s, application_name=application_name("worker", queues))
    client = await connect_temporal(s, telemetry=telemetry, runtime=temporal_runtime(s))
    try:
        await run_workers(client, parts, queues, stop, telemetry=telemetry)
    finally:
        await parts.close()
        telemetry.shutdown()


def _serve_metrics(s: Settings, start: Callable[[Settings], str | None]) -> None:
    url = start(s)
    if url:
        log.info("metrics served", extra={"url": url})
    if s.temporal_metrics_port:
        log.info(
            "Temporal SDK metrics served",
            extra={"url": f"http://{s.metrics_host}:{s.temporal_metrics_port}/metrics"},
        )


def cmd_worker(args: argparse.Namespace) -> int:
    from runtime.worker import ALL_QUEUES

    queues = args.queue or list(ALL_QUEUES)
    for q in queues:
        if q not in ALL_QUEUES:
            print(f"unknown queue {q!r}; expected one of {', '.join(ALL_QUEUES)}", file=sys.stderr)
            return 2
    s = _startup("worker", queues=args.queue or ())  # no --queue: every queue
    telemetry = _observability(s, "worker", queues if args.queue else ())
    asyncio.run(_worker_main(s, queues, telemetry))
    return 0


async def _relay_main(s: Settings, telemetry: Telemetry) -> None:
    """The relay loop and the webhook deliverer (supervised), with no Temporal worker: dispatch
    and delivery capacity beside the system workers, whose relay runs as an activity."""
    from activities.relay import Relay
    from runtime.telemetry import start_metrics_server, temporal_runtime
    from runtime.wiring import build_parts, connect_temporal, process_listener, relay_config
    from runtime.worker import run_pollers

    stop = asyncio.Event()
    _install_stop(asyncio.get_running_loop(), stop)
    _serve_metrics(s, start_metrics_server)
    parts = build_parts(s, application_name=application_name("relay"))
    client = await connect_temporal(s, telemetry=telemetry, runtime=temporal_runtime(s))
    listener = process_listener(parts)  # the process's one LISTEN connection
    gc.freeze()  # start-up's objects out of the collector's walks, as in the worker
    try:
        relay = Relay(parts.sessionmaker, client, parts.catalog, relay_config(s), listener=listener)
        listener.start()
        await run_pollers(client, parts, stop, listener, relay=relay)
    finally:
        stop.set()
        await listener.close()
        await parts.close()
        telemetry.shutdown()


def cmd_relay(args: argparse.Namespace) -> int:
    s = _startup("relay")
    asyncio.run(_relay_main(s, _observability(s, "relay")))
    return 0


async def _reconcile_main(s: Settings) -> None:
    from activities.reconciler import Reconciler
    from runtime.wiring import build_parts, connect_temporal, reconciler_config

    parts = build_parts(s, application_name=application_name("reconcile"))
    client = await connect_temporal(s)
    try:
        result = await Reconciler(
            parts.sessionmaker, client, reconciler_config(s), catalog=parts.catalog
        ).run_once()
        print(result)
    finally:
        await parts.close()


def cmd_reconcile(args: argparse.Namespace) -> int:
    asyncio.run(_reconcile_main(_startup("reconcile")))
    return 0


async def _setup_temporal(s: Settings) -> None:
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
    from temporalio.service import RPCError

    from engine import search_attributes
    from runtime.wiring import connect_temporal

    client = await connect_temporal(s)
    for name in search_attributes.NAMES:
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(
                    namespace=s.temporal_namespace,
                    search_attributes={name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD},
                )
            )
            print(f"registered search attribute {name}")
        except RPCError as exc:
            if "already" in str(exc).lower():
                print(f"search attribute {name} already registered")
            else:
                raise


def cmd_setup_temporal(args: argparse.Namespace) -> int:
    asyncio.run(_setup_temporal(_startup("setup-temporal")))
    return 0


def cmd_outbox(args: argparse.Namespace) -> int:
    asyncio.run(operator_commands.outbox_dead(_startup("outbox-dead"), args.requeue))
    return 0


def cmd_rotate_keys(args: argparse.Namespace) -> int:
    return asyncio.run(operator_commands.rotate_keys(_startup("rotate-keys")))


def cmd_dev(args: argparse.Namespace) -> int:
    from runtime.devstack import run_dev

    return run_dev(args)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's help ends with its default, except a required flag's (it has none)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    from runtime import jobs_cli

    fmt = HelpFormatter
    p = argparse.ArgumentParser(prog="aijobs", description=__doc__, formatter_class=fmt)
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser(
        "dev", help="run the whole stack on embedded PostgreSQL and Temporal", formatter_class=fmt
    )
    d.add_argument("--data-dir", default=".aijobs", help="where the embedded stack keeps its data")
    d.add_argument("--api-port", type=int, default=8000, help="port of the HTTP API")
    d.add_argument("--temporal-port", type=int, default=7233, help="port of the Temporal server")
    d.add_argument("--ui-port", type=int, default=8233, help="port of the Temporal UI")
    d.add_argument("--fresh", action="store_true", help="delete the data dir first")
    d.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="first port of the workers' metrics endpoints (each worker gets its own; "
        "None: 9464, or free ports when those are taken)",
    )
    d.set_defaults(func=cmd_dev)

    sub.add_parser("migrate", help="apply database migrations", formatter_class=fmt).set_defaults(
        func=cmd_migrate
    )

    a = sub.add_parser("api", help="serve the HTTP API", formatter_class=fmt)
    a.add_argument("--host", default="0.0.0.0", help="address to listen on")
    a.add_argument("--port", type=int, default=8000, help="port to serve")
    a.set_defaults(func=cmd_api)

    w = sub.add_parser("worker", help="run Temporal workers", formatter_class=fmt)
    w.add_argument(
        "--queue",
        action="append",
        help="task queue to serve: ai-interactive | ai-background | ai-system (repeatable; "
        "None: all three)",
    )
    w.set_defaults(func=cmd_worker)

    sub.add_parser(
        "relay", help="run the relay and webhook pollers", formatter_class=fmt
    ).set_defaults(func=cmd_relay)
    sub.add_parser("reconcile", help="run the reconciler once", formatter_class=fmt).set_defaults(
        func=cmd_reconcile
    )

    t = sub.add_parser("token", help="sign a bearer token with JWT_SECRET", formatter_class=fmt)
    t.add_argument("--user", required=True, help="the token's user id (its subject)")
    t.add_argument("--admin", action="store_true", help="an admin token")
    t.add_argument("--ttl", type=int, default=86_400, help="seconds, at most 30 days")
    t.add_argument("--org", help="the user's organisation (claim JWT_ORG_CLAIM)")
    t.add_argument("--team", action="append", help="a team of the user's (repeatable)")
    t.set_defaults(func=cmd_token)

    sub.add_parser(
        "setup-temporal",
        help="register the search attributes on an external cluster",
        formatter_class=fmt,
    ).set_defaults(func=cmd_setup_temporal)

    sub.add_parser(
        "rotate-keys",
        help="re-encrypt every stored secret (users' provider keys, webhook signing secrets) "
        "under the current CREDENTIAL_ENCRYPTION_KEY key id",
        formatter_class=fmt,
    ).set_defaults(func=cmd_rotate_keys)

    o = sub.add_parser("outbox-dead", help="list dead outbox events", formatter_class=fmt)
    o.add_argument("--requeue", action="store_true", help="requeue the dead events listed")
    o.set_defaults(func=cmd_outbox)

    jobs_cli.add_parser(sub, fmt)
    settings_cli.add_parser(sub, fmt)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    code = args.func(args)
    sys.stdout.flush()
    sys.stderr.flush()
    # Exit without interpreter teardown: the Temporal SDK's runtime can abort at exit
    # (a known problem of the Python SDK) after all work is done, which would turn success into
    # a crash code.
    with contextlib.suppress(Exception):
        logging.shutdown()
    os._exit(int(code or 0))


if __name__ == "__main__":
    main()
