"""Engine ``/metrics`` scrapes (direct or through PromQL) -> governor telemetry records."""
