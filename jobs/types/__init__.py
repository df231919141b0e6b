"""Every job type, one module each. Adding a job type = its module + one line here."""

from __future__ import annotations

from jobs.spec import Catalog, JobType
from jobs.types import synthetic

ALL_TYPES: list[JobType] = [
    synthetic.JOB,
]


def default_catalog() -> Catalog:
    return Catalog(ALL_TYPES)
