"""Temporal workflows: deterministic, sandbox-safe, importing only `engine` and temporalio."""
