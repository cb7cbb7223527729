#!/usr/bin/env bash
# `make bench`: builds everything in release, runs each contender on loopback under wrk, one
# after the other in this one run, and prints the issue's table as ratios (absolute numbers are
# noise on a shared machine; ratios measured side by side are not). Writes BENCHMARKS.md and
# bench/throughput.svg. Needs wrk (installed here from Debian if missing) and, for the
# `wasmtime serve` rows, a `wasmtime` CLI on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_RUN=${BENCH_SECONDS:-10}
MEMORY_SECONDS=${BENCH_MEMORY_SECONDS:-60}
CONNECTIONS=32
RESULTS=$(mktemp -d)
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

if ! command -v wrk >/dev/null; then
  echo "installing wrk (Debian package)"
  apt-get update -qq && apt-get install -y -qq wrk
fi
rustup target add wasm32-wasip2 >/dev/null
cargo build --release --target wasm32-wasip2 -p guest -p minimal-guest
cargo build --release -p host -p baseline

WASM=target/wasm32-wasip2/release
HOST=target/release/host
CACHE=$RESULTS/cache

# Waits until $1 answers /api/health.
wait_ready() {
  for _ in $(seq 1 500); do
    curl -sf "$1/api/health" >/dev/null 2>&1 && return 0
    sleep 0.01
  done
  echo "no answer from $1" >&2; exit 1
}

# Runs wrk against $2 and stores its JSON line as $RESULTS/$1.json.
load() {
  local name=$1 url=$2
  wrk -t2 -c$CONNECTIONS -d"${SECONDS_PER_RUN}s" --latency -s bench/wrk-report.lua "$url" \
    | grep '^{' > "$RESULTS/$name.json"
  echo "  $name: $(cat "$RESULTS/$name.json")"
}

# A UDP sink standing in for the Jaeger agent, so spans really leave the host.
python3 -c '
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 16831))
while True: s.recv(65536)' &
PIDS+=($!)

start_host() { # name port guest [extra env...]
  local port=$2 guest=$3; shift 3
  env "$@" GUEST_CACHE_DIR="$CACHE" LOG_FILE="$RESULTS/app.log" RUST_LOG=info \
    OTEL_EXPORTER_JAEGER_AGENT_HOST=127.0.0.1 OTEL_EXPORTER_JAEGER_AGENT_PORT=16831 \
    "$HOST" --bind 127.0.0.1 --port "$port" --guest "$guest" >/dev/null 2>&1 &
  PIDS+=($!)
  wait_ready "http://127.0.0.1:$port"
}

echo "== throughput (wrk -t2 -c$CONNECTIONS, ${SECONDS_PER_RUN}s each, GET /api/health)"
target/release/baseline 18081 >/dev/null & PIDS+=($!); wait_ready http://127.0.0.1:18081
load native-hyper http://127.0.0.1:18081/api/health
kill "${PIDS[-1]}"

start_host minimal 18082 "$WASM/minimal_guest.wasm"
load host-minimal http://127.0.0.1:18082/api/health
kill "${PIDS[-1]}"

start_host real 18083 "$WASM/guest.wasm"
load host-real http://127.0.0.1:18083/api/health

if command -v wasmtime >/dev/null; then
  wasmtime serve -Scli --addr 127.0.0.1:18084 "$WASM/minimal_guest.wasm" >/dev/null 2>&1 & PIDS+=($!)
  wait_ready http://127.0.0.1:18084
  load wasmtime-serve-minimal http://127.0.0.1:18084/api/health
  kill "${PIDS[-1]}"
else
  echo "  wasmtime serve: skipped, no wasmtime CLI (cargo install wasmtime-cli --version 48.0.8 --locked)"
fi

echo "== GET /api/health latency while two clients keep both cores busy with n=32 computes"
wrk -t1 -c1 -d"$((SECONDS_PER_RUN + 2))s" -s bench/wrk-compute.lua http://127.0.0.1:18083/api/compute >/dev/null & CPU1=$!
wrk -t1 -c1 -d"$((SECONDS_PER_RUN + 2))s" -s bench/wrk-compute.lua http://127.0.0.1:18083/api/compute >/dev/null & CPU2=$!
sleep 1
wrk -t1 -c4 -d"${SECONDS_PER_RUN}s" --latency -s bench/wrk-report.lua http://127.0.0.1:18083/api/health \
  | grep '^{' > "$RESULTS/health-under-compute.json"
wait $CPU1 $CPU2
echo "  health-under-compute: $(cat "$RESULTS/health-under-compute.json")"

echo "== fib(30) in the guest vs native, and one instantiate + handle (criterion)"
cargo bench -p host --bench per_request -- --noplot --warm-up-time 1 --measurement-time 3 >/dev/null
cp -r target/criterion "$RESULTS/criterion"

echo "== resident memory at 256 connections over ${MEMORY_SECONDS}s"
HOST_PID=$(pgrep -f "port 18083" | head -1)
wrk -t2 -c256 -d"${MEMORY_SECONDS}s" http://127.0.0.1:18083/api/users >/dev/null & LOAD=$!
sleep 5; RSS_EARLY=$(awk '/VmRSS/ {print $2}' /proc/$HOST_PID/status)
wait $LOAD; RSS_LATE=$(awk '/VmRSS/ {print $2}' /proc/$HOST_PID/status)
echo "{\"rss_early_kb\":$RSS_EARLY,\"rss_late_kb\":$RSS_LATE}" > "$RESULTS/memory.json"
echo "  memory: $(cat "$RESULTS/memory.json")"

echo "== start to first 200, release build, compiled-component cache warm"
kill "$HOST_PID"
START_NS=$(date +%s%N)
start_host warm 18085 "$WASM/guest.wasm"
echo "{\"start_ms\":$(( ($(date +%s%N) - START_NS) / 1000000 ))}" > "$RESULTS/start.json"
echo "  start: $(cat "$RESULTS/start.json")"

python3 bench/report.py "$RESULTS"
