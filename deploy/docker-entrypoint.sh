#!/bin/sh
# Container entrypoint: turns FLASHQ_* environment variables into server flags, then
# execs the bundle launcher (which sets LD_LIBRARY_PATH and finds cuBLASLt).
# Arguments given to `docker run IMAGE ...` are appended, so flags also work:
#   docker run flashq:cpu --workers-per-model=4
# An empty variable means "use the server's default".
#   FLASHQ_HOST, FLASHQ_GRPC_PORT, FLASHQ_METRICS_PORT, FLASHQ_BACKEND (auto|cpu|cuda),
#   FLASHQ_MODEL_REPOSITORY (a folder; unset = the embedded demo repository),
#   FLASHQ_DEMO_CACHE_DIR, FLASHQ_ARGS (extra flags, split on spaces).
set -eu
set --  ${FLASHQ_HOST:+--host="$FLASHQ_HOST"} \
        ${FLASHQ_GRPC_PORT:+--grpc-port="$FLASHQ_GRPC_PORT"} \
        ${FLASHQ_METRICS_PORT:+--metrics-port="$FLASHQ_METRICS_PORT"} \
        ${FLASHQ_BACKEND:+--backend="$FLASHQ_BACKEND"} \
        ${FLASHQ_MODEL_REPOSITORY:+--model-repository="$FLASHQ_MODEL_REPOSITORY"} \
        ${FLASHQ_DEMO_CACHE_DIR:+--demo-cache-dir="$FLASHQ_DEMO_CACHE_DIR"} \
        ${FLASHQ_ARGS:-} "$@"
exec /opt/flashq/bin/flashq server "$@"
