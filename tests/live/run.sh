#!/usr/bin/env bash
# `make live-checks`: starts the host (debug build, real guest) on a free loopback port, runs
# schemathesis with docs/openapi.yaml and the locust scenario against it, and stops it.
# Fails when either finds a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."

CONFORMANCE_SECONDS=${CONFORMANCE_SECONDS:-60}
LOAD_SECONDS=${LOAD_SECONDS:-20}
WORK=$(mktemp -d)
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT"

LOG_FILE="$WORK/app.log" RUST_LOG=warn GUEST_CACHE_DIR="$WORK/cache" \
  OTEL_EXPORTER_JAEGER_AGENT_HOST=127.0.0.1 OTEL_EXPORTER_JAEGER_AGENT_PORT=9 \
  target/debug/host --bind 127.0.0.1 --port "$PORT" >"$WORK/stdout" 2>&1 &
HOST_PID=$!
trap 'kill $HOST_PID 2>/dev/null || true; rm -rf "$WORK"' EXIT

for _ in $(seq 1 300); do
  curl -sf "$URL/api/health" >/dev/null 2>&1 && break
  kill -0 $HOST_PID 2>/dev/null || { cat "$WORK/stdout"; echo "the host exited" >&2; exit 1; }
  sleep 0.1
done

echo "== schemathesis against $URL (docs/openapi.yaml, ${CONFORMANCE_SECONDS}s)"
make --no-print-directory conformance SERVICE_URL="$URL" CONFORMANCE_SECONDS="$CONFORMANCE_SECONDS"
echo "== locust scenario against $URL (${LOAD_SECONDS}s)"
make --no-print-directory load SERVICE_URL="$URL" LOAD_SECONDS="$LOAD_SECONDS"
kill -0 $HOST_PID || { echo "the host died under the live checks" >&2; exit 1; }
