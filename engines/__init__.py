"""Real inference engines on one machine: their venv and tiny model (:mod:`engines.setup`), the
engine processes and the router, and the load client that replays a trace against them
(:mod:`engines.loadgen`).  Processes and HTTP on core, launch, aiohttp and orjson: no stream
worker, no simulator, no numerics (an import contract in pyproject.toml)."""
