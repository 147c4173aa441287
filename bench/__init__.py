"""Benchmarks, tuning and analysis on the simulators: they drive the shipped code, never a copy of it."""
