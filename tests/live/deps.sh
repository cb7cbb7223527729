#!/usr/bin/env bash
# `make deps`, which `make test` runs first: the Debian (or Ubuntu) packages the tests need beyond
# Rust. Run as root, it installs the missing ones; otherwise it stops at once and prints the
# command that would. The Python tools come after it, from make, into target/venv.
#   curl, make                  the Makefile and the live checks
#   gcc, libc6-dev              Rust links through cc; the host's allocator (mimalloc) is C
#   procps                      `kill`, with which the tests send SIGHUP and SIGTERM
#   prometheus                  the dashboard test's Prometheus, and promtool for deploy-check
#   docker-compose              deploy-check's `docker-compose config` (no Docker engine needed)
#   kubernetes-client           deploy-check's `kubectl kustomize` (no cluster needed)
#   postgresql                  server binaries and psql: the tests start clusters of their own
#   nodejs, npm                 componentize-js, for the JavaScript fixture guest
#   python3, python3-venv       schemathesis, locust, hadolint and componentize-py, in venvs
set -euo pipefail

missing=()
need() { command -v "$1" >/dev/null 2>&1 || missing+=("${@:2}"); }
need make make
need curl curl
need cc gcc
[ -e /usr/include/stdio.h ] || missing+=(libc6-dev)
[ -x /bin/kill ] || [ -x /usr/bin/kill ] || missing+=(procps)
# The tests take a Prometheus or a PostgreSQL from elsewhere when told where.
[ -n "${PROMETHEUS:-}" ] || need prometheus prometheus
need promtool prometheus
need docker-compose docker-compose
need kubectl kubernetes-client
need npm nodejs npm
need python3 python3
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then missing+=(python3-venv); fi
if [ -z "${PG_BINDIR:-}" ] && { ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || ! command -v psql >/dev/null; }; then
  missing+=(postgresql)
fi
# Each package once, in a stable order.
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | awk 'NF && !seen[$0]++')

if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "make deps: missing Debian packages; install them and run make again:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "make deps: installing ${missing[*]}"
  apt-get update -qq
  # Keep package scripts from starting services (PostgreSQL's system-wide cluster) never used.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod +x "$policy"
    # Removed however the install ends: left behind, it would stop every service's start.
    trap 'rm -f "$policy"' EXIT
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The toolchain file names them; rustup does not always install a toolchain file's components.
rustup component add rustfmt clippy >/dev/null 2>&1 || true
