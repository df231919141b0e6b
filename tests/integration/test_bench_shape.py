"""The bench's same-shape baseline (`bench/bare_workflows.py`) runs the engine's stage shape:
the same stages in the same order, the same ones local, so engine ÷ baseline in `make bench`
compares the stages' work and not a different number of activities."""

from __future__ import annotations

import uuid

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench import temporal_features
from bench.bare_workflows import SHAPE_STAGES, SHAPE_WORKFLOW
from bench.baseline import build_worker
from engine.contracts import COMPLETE, EXECUTE, PREPARE, PROJECT, RESOLVE
from tests.integration.engine_helpers import local_stages, stage_names


async def test_the_same_shape_baseline_runs_the_engine_stages_in_order(
    temporal_client: Client,
) -> None:
    queue = f"bench-shape-test-{uuid.uuid4().hex[:8]}"
    wid = f"bench-shape-test-{uuid.uuid4().hex[:8]}"
    async with build_worker(temporal_client, shape="five", task_queue=queue):
        handle = await temporal_client.start_workflow(SHAPE_WORKFLOW, wid, id=wid, task_queue=queue)
        assert await handle.result() == wid
        history = await handle.fetch_history()
    engine_order = [PREPARE, RESOLVE, EXECUTE, PROJECT, COMPLETE]
    assert stage_names(history) == [f"bench_{name}" for name in engine_order]
    # EXECUTE is the one regular activity (the engine's provider slot); the rest are local.
    assert local_stages(history) == [f"bench_{name}" for name in engine_order if name != EXECUTE]


async def test_the_stage_bench_runs_every_stage_of_real_jobs(database_url: str) -> None:
    """`python -m bench.stages` (each stage's CPU per job, outside Temporal) runs the five stage
    activities on jobs created through the service, each job to `succeeded`."""
    from bench.stages import STAGES, measure

    per_stage = await measure(database_url, jobs=3, rounds=1)
    assert list(per_stage) == list(STAGES)
    assert all(len(v) == 1 and v[0] > 0 for v in per_stage.values()), per_stage


async def test_each_feature_variant_adds_what_it_names_to_the_shape(
    temporal_client: Client,
) -> None:
    """`bench.temporal_features`: each variant's run carries the one feature it adds (start
    search attributes, a fairness key, the patch marker, the final upsert) on top of the
    previous one's, and still runs the five stages."""
    queue = f"bench-features-test-{uuid.uuid4().hex[:8]}"
    seen: dict[str, dict[str, object]] = {}
    async with temporal_features.worker(temporal_client, queue):
        for name in temporal_features.VARIANTS:
            [wid] = await temporal_features.run_variant(temporal_client, queue, name, 1)
            handle = temporal_client.get_workflow_handle(wid)
            history = await handle.fetch_history()
            started = history.events[0].workflow_execution_started_event_attributes
            markers = [
                e.marker_recorded_event_attributes.marker_name
                for e in history.events
                if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            ]
            upserts = [
                sorted(
                    e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
                )
                for e in history.events
                if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
            ]
            assert stage_names(history) == [f"bench_{s}" for s in SHAPE_STAGES], name
            seen[name] = {
                "start_sas": sorted(started.search_attributes.indexed_fields),
                "fairness": started.priority.fairness_key,
                "patch": "core_patch" in markers,
                "upserts": upserts,
            }
    assert seen["shape"] == {"start_sas": [], "fairness": "", "patch": False, "upserts": []}
    assert seen["+start SAs"]["start_sas"] == ["JobId", "JobType", "LifecycleStatus"]
    assert seen["+start SAs"]["fairness"] == ""
    assert seen["+priority/fairness"]["fairness"] == "user-0"
    assert not seen["+priority/fairness"]["patch"]
    assert seen["+patch marker"]["patch"]
    assert seen["+patch marker"]["upserts"] == [["TemporalChangeVersion"]]
    assert seen["+final upsert"]["upserts"] == [["TemporalChangeVersion"], ["LifecycleStatus"]]
