#!/usr/bin/env bash
# Instructions a request, counted by callgrind instead of timed: the release host serves
# `GET /api/health` with full telemetry (INFO lines to stdout and a file, spans to a local UDP
# sink) under valgrind, counting only while `wrk -t1 -c4` runs after a warm-up, and the count is
# divided by the requests served. Two runs of the same build agree to a few hundred
# instructions, where timed rounds on a shared machine move by a tenth (bench/PROFILE.md,
# section 17). CACHE_SIM=1 counts the first-level cache misses too.
#
#   bench/count.sh [GUEST.wasm] [SECONDS]        (defaults: the real guest, 10 s)
#
# HOST_ARGS adds flags to the host's (reuse, say: HOST_ARGS="--max-instance-reuse-count 128
# --max-instance-concurrent-reuse-count 16"); URL_PATH asks another path (a fixture's `/`);
# CONNECTIONS sets wrk's connections (4).
#
# Needs valgrind and wrk, and a release build (`cargo build --release -p host`). Leaves the
# profile in target/count/, for `callgrind_annotate`.
set -euo pipefail
cd "$(dirname "$0")/.."

GUEST=${1:-target/wasm32-wasip2/release/guest.wasm}
SECONDS_COUNTED=${2:-10}
HOST=target/release/host
OUT=target/count
PORT=${COUNT_PORT:-18190}
mkdir -p "$OUT"
for tool in valgrind callgrind_control wrk python3; do
  command -v "$tool" >/dev/null || { echo "$tool is needed" >&2; exit 1; }
done
[ -x "$HOST" ] || { echo "no $HOST: cargo build --release -p host" >&2; exit 1; }

PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

# The Jaeger agent: a UDP socket that reads and drops, so the spans are encoded and sent.
python3 -u -c '
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
while True: s.recv(65536)' >"$OUT/agent-port" &
PIDS+=($!)
until [ -s "$OUT/agent-port" ]; do sleep 0.1; done

profile="$OUT/callgrind.$(basename "$GUEST" .wasm).out"
cache_sim=no
[ "${CACHE_SIM:-0}" = 1 ] && cache_sim=yes
env GUEST_CACHE_DIR="$OUT/cache" LOG_FILE="$OUT/app.log" RUST_LOG=info \
  OTEL_EXPORTER_JAEGER_AGENT_HOST=127.0.0.1 OTEL_EXPORTER_JAEGER_AGENT_PORT="$(head -1 "$OUT/agent-port")" \
  valgrind --tool=callgrind --instr-atstart=no --cache-sim=$cache_sim --smc-check=all-non-file \
  --callgrind-out-file="$profile" \
  "$HOST" ${HOST_ARGS:-} --bind 127.0.0.1 --port "$PORT" --guest "$GUEST" >/dev/null 2>"$OUT/valgrind.log" &
host=$!
PIDS+=($host)
# Under valgrind the host takes seconds to compile the guest and start.
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$PORT${URL_PATH:-/api/health}" >/dev/null && break
  sleep 0.2
done
wrk -t1 -c"${CONNECTIONS:-4}" -d5s "http://127.0.0.1:$PORT${URL_PATH:-/api/health}" >/dev/null
callgrind_control -i on "$host" >/dev/null 2>&1
served=$(wrk -t1 -c"${CONNECTIONS:-4}" -d"${SECONDS_COUNTED}s" "http://127.0.0.1:$PORT${URL_PATH:-/api/health}" | awk '/requests in/{print $1}')
callgrind_control -i off "$host" >/dev/null 2>&1
kill -INT "$host"
wait "$host" || true

python3 - "$OUT/valgrind.log" "$served" "$GUEST" <<'PY'
import sys
log, served, guest = sys.argv[1], int(sys.argv[2]), sys.argv[3]
names, counts = [], []
for line in open(log):
    if "Events    :" in line:
        names = line.split(":", 1)[1].split()
    if "Collected :" in line:
        counts = [int(n) for n in line.split(":", 1)[1].split()]
print(f"{guest}: {served} requests counted")
for name, count in zip(names, counts):
    print(f"  {name:5} {count / served:10.0f} a request")
PY
echo "profile: $profile (callgrind_annotate --inclusive=yes $profile)"
