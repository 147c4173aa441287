"""Defaults of settings that other code also takes as parameters, each written once.

:class:`core.settings.Settings` and :class:`core.settings.ModelSpec` default
their fields to these constants; a controller, driver, executor, simulator or
peer autoscaler that takes the same quantity as a parameter defaults it to the
same constant, never to a literal of its own (``tests/unit/test_settings_defaults.py``
fails when a settings default is written again as a literal).

>>> TTFT_SLO_MS, WINDOW_S
(1000.0, 10.0)
"""

from __future__ import annotations

__all__ = [
    "CLOCK_SPEED",
    "COMMAND_TTL_S",
    "EPS_REF",
    "HEARTBEAT_S",
    "ITL_SLO_MS",
    "LATENESS_S",
    "MAX_DELIVERIES",
    "MAX_REPLICAS",
    "MIN_REPLICAS",
    "STALE_WINDOWS",
    "TTFT_SLO_MS",
    "WINDOW_S",
]

# -- a model's SLO and replica bounds (ModelSpec; GOVERNOR_MODELS) --------------------------
TTFT_SLO_MS = 1000.0  # time to first token a request must beat
ITL_SLO_MS = 150.0  # mean inter-token latency a request must beat
MIN_REPLICAS = 1
MAX_REPLICAS = 64

# -- the control loop ------------------------------------------------------------------------
WINDOW_S = 10.0  # GOVERNOR_WINDOW_S: the window length and control period
LATENESS_S = 2.0  # GOVERNOR_LATENESS_S
EPS_REF = 0.02  # GOVERNOR_EPS_REF: the SLO-violation-rate reference
STALE_WINDOWS = 3  # GOVERNOR_STALE_WINDOWS
CLOCK_SPEED = 1.0  # GOVERNOR_CLOCK_SPEED: trace seconds per wall second
COMMAND_TTL_S = 60.0  # GOVERNOR_COMMAND_TTL_S: seconds a command stays valid

# -- executors -------------------------------------------------------------------------------
MAX_DELIVERIES = 5  # GOVERNOR_MAX_DELIVERIES
HEARTBEAT_S = 5.0  # GOVERNOR_HEARTBEAT_S
