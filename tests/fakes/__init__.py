"""Fakes of external services used by the tests."""
