"""Telemetry sources: each engine source's pure half beside its runner, behind one source interface."""
