"""OTLP/HTTP request spans -> governor telemetry records."""
