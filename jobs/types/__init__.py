"""Every job type, one module each. Adding a job type is its module, its name in the import
below and one entry in ALL_TYPES (docs/adding-a-job-type.md)."""

from __future__ import annotations

from jobs.spec import AnyJobType, Catalog
from jobs.types import flashcard_generation, quiz_generation, synthetic, weak_point_analysis

ALL_TYPES: list[AnyJobType] = [
    synthetic.JOB,
    quiz_generation.JOB,
    flashcard_generation.JOB,
    weak_point_analysis.JOB,
]


def default_catalog() -> Catalog:
    return Catalog(ALL_TYPES)
