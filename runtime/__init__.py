"""Processes: settings, worker bootstrap, the embedded dev stack and the `aijobs` CLI."""
