"""Every job type, one module each. Adding a job type = its module + one line here."""

from __future__ import annotations

from jobs.spec import Catalog, JobType
from jobs.types import flashcard_generation, quiz_generation, synthetic, weak_point_analysis

ALL_TYPES: list[JobType] = [
    synthetic.JOB,
    quiz_generation.JOB,
    flashcard_generation.JOB,
    weak_point_analysis.JOB,
]


def default_catalog() -> Catalog:
    return Catalog(ALL_TYPES)
