"""Temporal activities: the five stages, the relay and the reconciler."""
