"""The bottom layer of the control plane: settings, clock, names, vocabularies.

Everything above (controllers, streams, executors, sim, the CLI) may import
``core``; ``core`` imports only the standard library and the telemetry
contract (``governor_telemetry``).  import-linter checks both directions.
"""
