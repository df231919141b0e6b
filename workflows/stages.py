"""Typed stubs of the job stages, for the workflow to call by reference: the name an activity
runs under and its input and result types are declared once, here, and checked by mypy at every
call. The worker registers the real implementations (activities/) under the same names; these
bodies never run."""

from __future__ import annotations

from typing import NoReturn

from temporalio import activity

from engine.contracts import (
    COMPLETE,
    EXECUTE,
    FINALIZE_CANCELLED,
    FINALIZE_FAILED,
    MERGE,
    PREPARE,
    PROJECT,
    RESOLVE,
    REUSE,
    CompleteInput,
    CompleteResult,
    ExecuteInput,
    ExecuteResult,
    FinalizeFailedInput,
    FinalizeResult,
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


def _stub(name: str) -> NoReturn:
    raise RuntimeError(f"{name} is a stub: the worker registers the real stage")


@activity.defn(name=PREPARE)
async def prepare(inp: StageInput) -> PrepareResult:
    _stub(PREPARE)


@activity.defn(name=RESOLVE)
async def resolve(inp: StageInput) -> ResolveResult:
    _stub(RESOLVE)


@activity.defn(name=EXECUTE)
async def execute(inp: ExecuteInput) -> ExecuteResult:
    _stub(EXECUTE)


@activity.defn(name=PROJECT)
async def project(inp: ProjectInput) -> ProjectResult:
    _stub(PROJECT)


@activity.defn(name=MERGE)
async def merge(inp: MergeInput) -> MergeResult:
    _stub(MERGE)


@activity.defn(name=REUSE)
async def reuse(inp: ReuseInput) -> ReuseResult:
    _stub(REUSE)


@activity.defn(name=COMPLETE)
async def complete(inp: CompleteInput) -> CompleteResult:
    _stub(COMPLETE)


@activity.defn(name=FINALIZE_FAILED)
async def finalize_failed(inp: FinalizeFailedInput) -> FinalizeResult:
    _stub(FINALIZE_FAILED)


@activity.defn(name=FINALIZE_CANCELLED)
async def finalize_cancelled(inp: StageInput) -> FinalizeResult:
    _stub(FINALIZE_CANCELLED)
