"""Helpers for the project's own test suites (fixtures, API server access). Not used at run time."""
