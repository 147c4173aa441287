"""Launch helpers: embedded servers, child processes, topic creation, probes, process logging."""
