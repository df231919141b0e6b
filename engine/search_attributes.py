"""The custom search attributes of the job workflows (keywords): the job's id, its type and its
lifecycle status, so Temporal's visibility can find a job's runs. The relay sets all three when it
starts a workflow, the workflow updates the status as the job moves; `aijobs setup-temporal` and
the embedded development server register them (`NAMES`)."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

JOB_ID = SearchAttributeKey.for_keyword("JobId")
JOB_TYPE = SearchAttributeKey.for_keyword("JobType")
LIFECYCLE_STATUS = SearchAttributeKey.for_keyword("LifecycleStatus")

ALL: tuple[SearchAttributeKey[str], ...] = (JOB_ID, JOB_TYPE, LIFECYCLE_STATUS)
# What registration needs: all of them are keywords.
NAMES: tuple[str, ...] = tuple(k.name for k in ALL)
