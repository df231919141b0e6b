"""`make bench`: the engine measured against baselines, on the same machine, in the same run.

Everything runs on the embedded stack (a fresh PostgreSQL data dir with default durability, an
in-memory headless Temporal dev server); the engine's workers, relay and API run as subprocesses
exactly as a deployment runs them. Each figure is the median of several repetitions after a
warm-up; what each figure measures and how is described in `bench/figures.py`, how to run and
read the table in `docs/benchmarks.md`. The table goes to stdout, progress to stderr, and
everything (versions, parameters, raw repetitions) to `bench/results/latest.json`. Not part of
the test suite.
"""
