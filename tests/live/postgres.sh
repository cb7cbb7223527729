#!/usr/bin/env bash
# `make postgres`: a throwaway PostgreSQL cluster for trying the store, started as the tests
# start theirs: the newest server of Debian's or Ubuntu's postgresql package, trust
# authentication, TCP on 127.0.0.1 only, data under target/pg, and a database `tutorial`.
# `make postgres-stop` stops it; `rm -rf target/pg` then removes it.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=$PWD/target/pg
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$PG_BIN" ]; then
  echo "no PostgreSQL server here: run  sudo apt-get install postgresql  and again" >&2
  exit 1
fi
# initdb refuses to run as root: as root, the cluster belongs to the postgres system user.
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
case "${1:-start}" in
  stop)
    if [ -d "$DIR/data" ] && as_pg "$PG_BIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; then
      as_pg "$PG_BIN/pg_ctl" -D "$DIR/data" -m fast stop
    fi
    ;;
  start)
    port=${2:-5433}
    mkdir -p "$DIR"
    if [ "$(id -u)" = 0 ]; then
      chown postgres: "$DIR"
      if ! runuser -u postgres -- test -w "$DIR"; then
        echo "the postgres user cannot reach $DIR (a parent directory is closed to it):" >&2
        echo "run make postgres from a clone outside /root, or as another user" >&2
        exit 1
      fi
    fi
    if [ ! -d "$DIR/data" ]; then
      as_pg "$PG_BIN/initdb" -D "$DIR/data" -U postgres --auth=trust >/dev/null
    fi
    if ! as_pg "$PG_BIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; then
      # No Unix socket: its path would depend on the clone's, and be too long in a deep one.
      if ! as_pg "$PG_BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w \
        -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=''" start >/dev/null; then
        echo "PostgreSQL did not start; its log, $DIR/log, ends:" >&2
        tail -5 "$DIR/log" >&2
        exit 1
      fi
    fi
    port=$(sed -n 4p "$DIR/data/postmaster.pid")
    exists=$("$PG_BIN/psql" -X -h 127.0.0.1 -p "$port" -U postgres -qtAc \
      "select 1 from pg_database where datname = 'tutorial'")
    [ "$exists" = 1 ] || "$PG_BIN/createdb" -h 127.0.0.1 -p "$port" -U postgres tutorial
    echo "PostgreSQL on 127.0.0.1:$port, database tutorial; serve users from it with:"
    echo "  cargo run -p host -- --store postgres://postgres@127.0.0.1:$port/tutorial"
    ;;
  *)
    echo "usage: $0 start [port] | stop" >&2
    exit 2
    ;;
esac
