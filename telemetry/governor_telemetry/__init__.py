"""governor's telemetry contract and producer, for inference nodes.

This distribution (``governor-telemetry``) is all an inference node installs:
the record schema and its validation (:mod:`governor_telemetry.records`), the
closed vocabularies (:mod:`governor_telemetry.vocab`) and the batching Kafka
producer (:mod:`governor_telemetry.producer`).  It depends on aiokafka and
orjson only; the control plane (``governor``) depends on it, never the other
way round.
"""

__version__ = "0.1.0"
