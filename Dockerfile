# syntax=docker/dockerfile:1
# governor: one image for every subcommand (worker, executor, fleet).
# The compose file and the Kubernetes manifests choose the subcommand with
# `command:`; there is deliberately no ENTRYPOINT, so `docker run IMAGE sh`
# still gives a shell.

# -- build: compile any dependency that has no wheel (gcc stays here) ---------
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# The runtime alone: pyproject's dependencies as pinned (with hashes) in requirements/runtime.lock,
# then governor itself with no dependency resolution.  No extras (embedded servers, benchmarks and
# plots, the local engine platform) and no dev tools: tests/unit/test_dependencies.py checks it.
COPY requirements/runtime.lock requirements/runtime.lock
RUN pip install --require-hashes -r requirements/runtime.lock
COPY . .
RUN pip install --no-deps ./telemetry .

# -- runtime --------------------------------------------------------------------
FROM python:3.11-slim
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    GOVERNOR_DATA_DIR=/var/lib/governor
COPY --from=build /opt/venv /opt/venv
# A fixed numeric uid so Kubernetes' runAsNonRoot can verify it.  The data
# directory exists in the image, owned by that user, so a named volume mounted
# there inherits the ownership.
RUN useradd --system --uid 10001 --user-group --home-dir /home/governor --create-home governor \
 && mkdir -p /var/lib/governor \
 && chown governor:governor /var/lib/governor
USER 10001:10001
WORKDIR /home/governor
# Prometheus exporters: worker 9464, executors 9465+ (see docker-compose.yml).
EXPOSE 9464 9465 9466
CMD ["governor", "worker"]
