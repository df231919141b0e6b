"""The pure domain of the engine: no I/O, safe to import inside Temporal's workflow sandbox."""
