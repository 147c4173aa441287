"""The real engines on one machine: their venv, the tiny model, the engine processes, the router, the load client."""
