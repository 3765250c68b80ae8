"""Reliability drills run against real processes (not part of the installed package)."""
