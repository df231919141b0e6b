"""Typed stubs of the job stages, for the workflow to call by reference: the name an activity
runs under (the stub's own name) and its input and result types are declared once, here, and
checked by mypy at every call. The worker registers the real implementations (activities/)
under the same names (tests/unit/test_activity_stubs.py checks names and types); these bodies
never run."""

from __future__ import annotations

from typing import NoReturn

from temporalio import activity

from engine.contracts import (
    CompleteInput,
    CompleteResult,
    ExecuteInput,
    ExecuteResult,
    FinalizeFailedInput,
    FinalizeResult,
    FlowExpireInput,
    FlowExpireResult,
    MergeInput,
    MergeResult,
    PrepareResult,
    ProjectInput,
    ProjectResult,
    ResolveResult,
    ReuseInput,
    ReuseResult,
    StageInput,
)


def stub() -> NoReturn:
    raise RuntimeError("a stub: the worker registers the real activity under its name")


@activity.defn
async def prepare(inp: StageInput) -> PrepareResult:
    stub()


@activity.defn
async def resolve(inp: StageInput) -> ResolveResult:
    stub()


@activity.defn
async def execute(inp: ExecuteInput) -> ExecuteResult:
    stub()


@activity.defn
async def project(inp: ProjectInput) -> ProjectResult:
    stub()


@activity.defn
async def merge(inp: MergeInput) -> MergeResult:
    stub()


@activity.defn
async def reuse(inp: ReuseInput) -> ReuseResult:
    stub()


@activity.defn
async def complete(inp: CompleteInput) -> CompleteResult:
    stub()


@activity.defn
async def finalize_failed(inp: FinalizeFailedInput) -> FinalizeResult:
    stub()


@activity.defn
async def finalize_cancelled(inp: StageInput) -> FinalizeResult:
    stub()


@activity.defn
async def flow_expire(inp: FlowExpireInput) -> FlowExpireResult:
    stub()
