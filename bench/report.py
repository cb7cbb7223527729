"""Turns one `make bench` run's results into the issue's table, BENCHMARKS.md and an SVG chart.

Usage: report.py RESULTS_DIR. Reads the JSON lines bench/run.sh stored there and criterion's
estimates; prints the table; writes BENCHMARKS.md and bench/throughput.svg.
"""
import json
import math
import os
import platform
import sys
from pathlib import Path

results = Path(sys.argv[1])
root = Path(__file__).resolve().parent.parent


def rps(run):
    return run["requests"] / (run["duration_us"] / 1e6) if run else None


def cpu_us(run):
    """The server's CPU time (user and system) per request over the run, in µs."""
    return run["server_cpu_ms"] * 1000 / run["requests"] if run and "server_cpu_ms" in run and run["requests"] else None


def rounds(name):
    """Every run stored under `name`, in the order measured: one a round for the throughput rows."""
    path = results / f"{name}.json"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def median(values):
    values = sorted(values)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def read(name):
    """The run stored under `name`; of several (throughput rounds), the median by requests/s."""
    runs = rounds(name)
    if len(runs) < 2:
        return runs[0] if runs else None
    return sorted(runs, key=rps)[(len(runs) - 1) // 2]


def paired(a, b, measure=rps):
    """`measure` of contender a over that of b, round by round. A forward round and the backward
    one after it (rounds 1 and 2, 3 and 4, ...) are averaged, geometrically, so a drift within a
    round favours neither side; the median over those pairs (a last round alone counts alone)."""
    ratios = [measure(x) / measure(y) if measure(x) and measure(y) else None
              for x, y in zip(rounds(a), rounds(b))]
    pairs = [ratios[i:i + 2] for i in range(0, len(ratios), 2)]
    means = [math.prod(pair) ** (1 / len(pair)) for pair in pairs if None not in pair]
    return median(means) if means else None


# BENCH_BEFORE's A/B (bench/run.sh): each pair's contender now, and that commit's host beside it.
AB_PAIRS = (("real guest, full telemetry over OTLP", "host-real-otlp", "host-before"),
            ("minimal guest", "host-minimal", "host-before-minimal"),
            ("WASIp3 fixture, reused 128 / 16", "host-p3-reuse", "host-before-p3-reuse"),
            ("minimal guest, reused 128", "host-minimal-reuse", "host-before-minimal-reuse"))
if os.environ.get("BENCH_AB_ONLY"):
    for guest, now, then in AB_PAIRS:
        requests, cpu = paired(now, then), paired(now, then, cpu_us)
        each = [f"{rps(x) / rps(y):.3f}" for x, y in zip(rounds(now), rounds(then))]
        print(f"{guest}, {len(each)} rounds: now / before requests/s {requests:.3f} (each round "
              f"{' '.join(each)}), CPU per request {cpu:.3f}")
    sys.exit(0)


def criterion_ns(group, bench):
    path = results / "criterion" / group / bench / "new" / "estimates.json"
    return json.loads(path.read_text())["mean"]["point_estimate"] if path.exists() else None


contenders = [
    ("native-hyper", "native tokio + hyper"),
    ("host-minimal", "our host + minimal guest"),
    ("host-nostd", "our host + no_std guest (grows its memory in every instance)"),
    ("host-real", "our host + real guest, full telemetry (spans to a Jaeger agent, UDP)"),
    ("host-real-otlp", "our host + real guest, spans, metrics and logs over OTLP/HTTP to a local receiver"),
    ("host-real-otlp-traces", "our host + real guest, only spans, over OTLP/HTTP"),
    ("host-real-otlp-metrics", "our host + real guest, only metrics, over OTLP/HTTP (pushed every second)"),
    ("host-real-otlp-logs", "our host + real guest, only log records, over OTLP/HTTP"),
    ("host-real-otlp-silent", "our host + real guest, all three over OTLP/HTTP to a receiver that never answers"),
    ("host-real-no-export", "our host + real guest, nothing exported (OTEL_TRACES_EXPORTER=none)"),
    ("wasmtime-serve-minimal", "wasmtime serve + minimal guest"),
    ("wasmtime-serve-nostd", "wasmtime serve + no_std guest"),
    ("host-python", "our host + Python guest (componentize-py), GET /hello"),
    ("wasmtime-serve-python", "wasmtime serve + Python guest, GET /hello"),
    ("host-js", "our host + JavaScript guest (componentize-js), GET /hello"),
    ("wasmtime-serve-js", "wasmtime serve + JavaScript guest, GET /hello"),
    ("host-p3", "our host + WASIp3 guest, a fresh instance per request"),
    ("wasmtime-serve-p3-fresh", "wasmtime serve + WASIp3 guest, fresh per request (--max-instance-reuse-count 1)"),
    ("host-p3-reuse", "our host + WASIp3 guest, reuse 128 / 16 (--max-instance-reuse-count 128)"),
    ("wasmtime-serve-p3-reuse", "wasmtime serve + WASIp3 guest, its default reuse (128 requests, 16 at once)"),
    ("host-minimal-reuse", "our host + minimal WASIp2 guest, reuse 128 (one request at a time)"),
]
runs = {name: read(name) for name, _ in contenders}
throughput = {name: rps(run) for name, run in runs.items()}
cpu = {name: cpu_us(run) for name, run in runs.items()}

fib = read("fib30")
per_request = {
    name: criterion_ns("instantiate_and_handle", name) for name in ("real-guest", "minimal-guest")
}
mixed = read("health-under-compute")
health_idle = read("health-idle")
health_slow_readers = read("health-slow-readers")
health_flood = read("health-connection-flood")
memory = read("memory")
start = read("start")
pgbench = read("pgbench-select-simple")
pgbench_prepared = read("pgbench-select-prepared")
stores = [("memory", "memory"), ("postgres", "PostgreSQL"),
          ("postgres-uncached", "PostgreSQL, --store-cache-mb 0 (every lookup a query)")]
store_runs = {(kind, store): read(f"{kind}-user-{store}") for kind in ("get", "create") for store, _ in stores}
store_rps = {key: rps(run) for key, run in store_runs.items()}


def ratio(a, b):
    return a / b if a and b else None


rows = [
    ("throughput, host + minimal guest / wasmtime serve + minimal guest",
     paired("host-minimal", "wasmtime-serve-minimal"), ">= 2.0", lambda v: v >= 2.0, "{:.2f}"),
    ("throughput, host + no_std guest / wasmtime serve + no_std guest",
     paired("host-nostd", "wasmtime-serve-nostd"), ">= 2.0", lambda v: v >= 2.0, "{:.2f}"),
    ("throughput, host + Python guest / wasmtime serve + Python guest",
     paired("host-python", "wasmtime-serve-python"), ">= 1.5 (goal 2.0)", lambda v: v >= 1.5, "{:.2f}"),
    ("throughput, host + JavaScript guest / wasmtime serve + JavaScript guest",
     paired("host-js", "wasmtime-serve-js"), ">= 1.5 (goal 2.0)", lambda v: v >= 1.5, "{:.2f}"),
    ("throughput, host + WASIp3 guest / wasmtime serve + WASIp3 guest, both fresh per request",
     paired("host-p3", "wasmtime-serve-p3-fresh"), ">= 2.0", lambda v: v >= 2.0, "{:.2f}"),
    ("throughput, host + WASIp3 guest, reuse 128 / 16 / wasmtime serve + WASIp3 guest, its default reuse",
     paired("host-p3-reuse", "wasmtime-serve-p3-reuse"), ">= 1.0 (goal 1.5)", lambda v: v >= 1.0, "{:.2f}"),
    ("headline: host + minimal WASIp2 guest, fresh per request / wasmtime serve + WASIp3 guest, its default reuse",
     paired("host-minimal", "wasmtime-serve-p3-reuse"), "", None, "{:.2f}"),
    ("reference: host + WASIp3 guest, fresh per request / wasmtime serve + WASIp3 guest, its default reuse",
     paired("host-p3", "wasmtime-serve-p3-reuse"), "", None, "{:.2f}"),
    ("reference: host + minimal WASIp2 guest, reuse 128 one at a time / wasmtime serve + WASIp3 guest, its default reuse",
     paired("host-minimal-reuse", "wasmtime-serve-p3-reuse"), "", None, "{:.2f}"),
    ("reference: host + minimal WASIp2 guest, reuse 128 one at a time / the same, fresh per request",
     paired("host-minimal-reuse", "host-minimal"), "", None, "{:.2f}"),
    ("throughput, host + real guest (full telemetry) / wasmtime serve + minimal guest",
     paired("host-real", "wasmtime-serve-minimal"), ">= 2.0", lambda v: v >= 2.0, "{:.2f}"),
    ("throughput, host + real guest (full telemetry) / host + minimal guest",
     paired("host-real", "host-minimal"), ">= 0.85", lambda v: v >= 0.85, "{:.2f}"),
    ("reference: server CPU per request, wasmtime serve + minimal guest / host + real guest",
     paired("wasmtime-serve-minimal", "host-real", cpu_us), "", None, "{:.2f}"),
    ("reference: server CPU per request, host + minimal guest / host + real guest",
     paired("host-minimal", "host-real", cpu_us), "", None, "{:.2f}"),
    ("throughput, host + real guest with OTLP/HTTP export / with Jaeger agent export",
     paired("host-real-otlp", "host-real"), "", None, "{:.2f}"),
    *[(f"throughput, host + real guest, {label} over OTLP / nothing exported",
       paired(name, "host-real-no-export"), ">= 0.9", lambda v: v >= 0.9, "{:.2f}")
      for name, label in (("host-real-otlp-traces", "spans"), ("host-real-otlp-metrics", "metrics"),
                          ("host-real-otlp-logs", "log records"),
                          ("host-real-otlp", "all three signals"))],
    ("GET /api/health p99, OTLP receiver that never answers / no export",
     paired("host-real-otlp-silent", "host-real-no-export", lambda run: run["p99_us"]),
     "<= 2.0", lambda v: v <= 2.0, "{:.2f}"),
    ("fib(30) in the guest (epoch deadline on) / native",
     fib["in_guest_ratio"] if fib else None, "<= 1.3", lambda v: v <= 1.3, "{:.2f}"),
    ("reference: the same function on a bare wasmtime engine, epochs on / native",
     fib["bare_epochs_ratio"] if fib else None, "", None, "{:.2f}"),
    ("reference: the same function on a bare wasmtime engine, epochs off / native",
     fib["bare_no_epochs_ratio"] if fib else None, "", None, "{:.2f}"),
    ("GET /api/health p99 while two clients run n=32 computes (ms)",
     mixed["p99_us"] / 1000 if mixed else None, "<= 10", lambda v: v <= 10, "{:.2f}"),
    ("GET /api/health p99 while 300 clients never read a list of 1,000 users (ms)",
     health_slow_readers["p99_us"] / 1000 if health_slow_readers else None, "<= 100",
     lambda v: v <= 100, "{:.2f}"),
    ("GET /api/health p99 while 1,000 half heads and 1,000 half bodies stay open (ms)",
     health_flood["p99_us"] / 1000 if health_flood else None, "<= 100", lambda v: v <= 100,
     "{:.2f}"),
    ("reference: GET /api/health p99 from the same 4 clients, nothing else connected (ms)",
     health_idle["p99_us"] / 1000 if health_idle else None, "", None, "{:.2f}"),
    ("host resident memory at 256 connections (MB)",
     memory["rss_late_kb"] / 1024 if memory else None, "<= 150", lambda v: v <= 150, "{:.1f}"),
    ("resident memory growth over the run (%)",
     100 * (memory["rss_late_kb"] - memory["rss_early_kb"]) / memory["rss_early_kb"] if memory else None,
     "<= 10", lambda v: v <= 10, "{:.1f}"),
    ("start to first 200, release, cache warm (s)",
     start["start_ms"] / 1000 if start else None, "<= 0.5", lambda v: v <= 0.5, "{:.3f}"),
    ("GET /api/users/{id} on PostgreSQL / pgbench -S on the same machine",
     ratio(store_rps[("get", "postgres")], pgbench["tps"] if pgbench else None), ">= 0.5",
     lambda v: v >= 0.5, "{:.2f}"),
    ("reference: the same / pgbench -S -M prepared",
     ratio(store_rps[("get", "postgres")], pgbench_prepared["tps"] if pgbench_prepared else None),
     "", None, "{:.2f}"),
    ("reference: GET /api/users/{id} on the memory store (the host's own ceiling) / pgbench -S",
     ratio(store_rps[("get", "memory")], pgbench["tps"] if pgbench else None), "", None, "{:.2f}"),
    ("reference: GET /api/users/{id} on PostgreSQL, every lookup a query / pgbench -S",
     ratio(store_rps[("get", "postgres-uncached")], pgbench["tps"] if pgbench else None), "",
     None, "{:.2f}"),
    ("POST /api/users on PostgreSQL / GET /api/users/{id} on PostgreSQL",
     ratio(store_rps[("create", "postgres")], store_rps[("get", "postgres")]), ">= 0.3",
     lambda v: v >= 0.3, "{:.2f}"),
]


def cell(value, fmt):
    return fmt.format(value) if value is not None else "n/a"


table = ["| Measure | This run | Target | Met |", "|---|---|---|---|"]
for label, value, target, ok, fmt in rows:
    if ok is None:
        met = "(reference)"
    else:
        met = "n/a" if value is None else ("yes" if ok(value) else "**no**")
    table.append(f"| {label} | {cell(value, fmt)} | {target} | {met} |")

contender_table = ["| Contender | requests/s | server CPU per request (µs) | p50 (ms) | p99 (ms) "
                   "| non-2xx + socket errors | / native |",
                   "|---|---|---|---|---|---|---|"]
for name, label in contenders:
    run = runs[name]
    if not run:
        contender_table.append(f"| {label} | not run | | | | | |")
        continue
    contender_table.append(
        f"| {label} | {throughput[name]:,.0f} | {cell(cpu[name], '{:.1f}')} | {run['p50_us'] / 1000:.2f} "
        f"| {run['p99_us'] / 1000:.2f} | {run['non_2xx'] + run['socket_errors']} "
        f"| {throughput[name] / throughput['native-hyper']:.3f} |")
store_table = ["| Store | request | requests/s | p50 (ms) | p99 (ms) | non-2xx + socket errors |",
               "|---|---|---|---|---|---|"]
for store, label in stores:
    for kind, request in (("get", "GET /api/users/{id}"), ("create", "POST /api/users")):
        run = store_runs[(kind, store)]
        if not run:
            store_table.append(f"| {label} | {request} | not run | | | |")
            continue
        store_table.append(
            f"| {label} | {request} | {rps(run):,.0f} | {run['p50_us'] / 1000:.2f} | "
            f"{run['p99_us'] / 1000:.2f} | {run['non_2xx'] + run['socket_errors']} |")
for label, run in (("pgbench -S, 32 clients", pgbench),
                   ("pgbench -S -M prepared, 32 clients", pgbench_prepared)):
    store_table.append(f"| PostgreSQL's own ceiling | {label} | {run['tps']:,.0f} transactions/s | | | |"
                       if run else f"| PostgreSQL's own ceiling | {label} | not run | | | |")

before_commit = results / "host-before-commit"
before = before_commit.read_text().strip() if before_commit.exists() else None
ab_table = []
if before:
    ab_table = ["| Hosts | before requests/s | now requests/s | now ÷ before, requests/s | server CPU "
                "per request before / now (µs) | now ÷ before, CPU per request | Target | Met |",
                "|---|---|---|---|---|---|---|---|"]
    for guest, now, then in AB_PAIRS:
        old, new = read(then), runs.get(now)
        if not old or not new:
            continue
        now_over_before = paired(now, then)
        met = "n/a" if now_over_before is None else ("yes" if now_over_before >= 0.95 else "**no**")
        ab_table.append(
            f"| {guest}: {before} vs now | {cell(rps(old), '{:,.0f}')} "
            f"| {cell(rps(new), '{:,.0f}')} | {cell(now_over_before, '{:.3f}')} "
            f"| {cell(cpu_us(old), '{:.1f}')} / {cell(cpu_us(new), '{:.1f}')} "
            f"| {cell(paired(now, then, cpu_us), '{:.3f}')} "
            f"| requests/s >= 0.95 | {met} |")
ab_section = f"""

## A/B: the host at {before} against this one (BENCH_BEFORE)

GET /api/health on the real guest, spans, metrics and logs over OTLP/HTTP (host-real-otlp's
settings), and on the minimal guest (host-minimal's), on both hosts; each round measures the two
one right after the other, and the ratios are paired round by round as above.

{chr(10).join(ab_table)}""" if before else ""

per_request_lines = [f"- one instantiate + handle of `GET /api/health`, no sockets: "
                     f"{name} {ns / 1000:.1f} µs" for name, ns in per_request.items() if ns]
if fib:
    per_request_lines.append(
        f"- fib(30), medians of interleaved rounds: native {fib['native_ns'] / 1e6:.2f} ms; in the guest "
        f"{fib['in_guest_ns'] / 1e6:.2f} ms (a request for n=30, {fib['request_ns'] / 1e6:.2f} ms, minus one "
        f"for n=0, {fib['empty_request_ns'] / 1e3:.0f} µs); as a hand-written core module "
        f"(host/benches/fib.wat) on a bare wasmtime engine, {fib['bare_epochs_ns'] / 1e6:.2f} ms with "
        f"epoch interruption and {fib['bare_no_epochs_ns'] / 1e6:.2f} ms without")

print("\n".join(contender_table))
print()
print("\n".join(table))
print()
if ab_table:
    print("\n".join(ab_table))
    print()
print("\n".join(store_table))
print()
print("\n".join(per_request_lines))

# The chart: requests/s per contender, and the health p99 under the mixed load.
bars = [(label, throughput[name]) for name, label in contenders if throughput[name]]
width, bar_height, left = 760, 34, 300
height = 70 + len(bars) * (bar_height + 12) + 60
peak = max(value for _, value in bars)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="13">',
       f'<rect width="{width}" height="{height}" fill="white"/>',
       '<text x="20" y="28" font-size="16" font-weight="bold">GET /api/health, requests/s (wrk -t2 -c32, loopback, 2 cores)</text>']
for i, (label, value) in enumerate(bars):
    y = 50 + i * (bar_height + 12)
    length = (width - left - 110) * value / peak
    svg.append(f'<text x="{left - 10}" y="{y + bar_height * 0.65}" text-anchor="end">{label}</text>')
    svg.append(f'<rect x="{left}" y="{y}" width="{length:.1f}" height="{bar_height}" fill="#4a7bd0"/>')
    svg.append(f'<text x="{left + length + 6:.1f}" y="{y + bar_height * 0.65}">{value:,.0f}</text>')
if mixed:
    y = height - 20
    svg.append(f'<text x="20" y="{y}">p99 of GET /api/health while both cores run n=32 computes: '
               f'{mixed["p99_us"] / 1000:.2f} ms (target 10 ms)</text>')
svg.append("</svg>")
(root / "bench" / "throughput.svg").write_text("\n".join(svg) + "\n")

cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "unknown")
machine = f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}"
(root / "BENCHMARKS.md").write_text(f"""# Benchmarks

Written by `make bench` (bench/run.sh, bench/report.py) from one run; every ratio compares
contenders measured one after the other in that run. Throughput is measured in {len(rounds("host-real")) or 'no'} rounds, in
alternating orders. A throughput ratio is taken round by round, so it compares measurements
minutes apart at most; each forward round is averaged with the backward one after it, so a
drift within a round favours neither contender, and the ratio is the median over those pairs.
A round that a neighbour on the shared machine slowed counts once, for both sides. A
contender's own row is its median round (of an even number, the slower middle one). Absolute numbers move with the machine and its neighbours; the ratios are what to
compare between runs. Beside each round's requests/s, the server's own CPU
time (user and system, from `/proc`) divided by the requests it served: wrk shares the two
cores, so requests/s also moves with wrk's share, and CPU per request moves less.

Machine: {machine}.

![requests/s per contender](bench/throughput.svg)

## Throughput and latency (wrk -t2 -c32, GET /api/health, {os.environ.get('BENCH_SECONDS', '10')} s each, the median round)

{chr(10).join(contender_table)}

The `no_std` guest (bench/hello-nostd) grows its linear memory in every fresh instance, as guests
built with dlmalloc or by other toolchains do; the host serves it as fast as the minimal guest
because it reuses guest memories without changing page protections. What growing cost before,
and why: [bench/PROFILE.md, section 6](bench/PROFILE.md#6-a-guest-that-grows-its-memory-the-hosts-own-memory-and-stack-pools).

## Targets

{chr(10).join(table)}{ab_section}

## User store (wrk -t2 -c32, {os.environ.get('BENCH_SECONDS', '10')} s each; a host per store, full telemetry)

Lookups cycle through 1,000 users stored first; every creation has an e-mail of its own. The
PostgreSQL cluster runs on the same two cores with stock settings (fsync on), so a 201 is a
durable commit. A PostgreSQL host serves a user it has seen before from memory (users never
change; `--store-cache-mb`, 16 MiB by default), so its lookups are mostly cache hits here; the
uncached row asks the database for every lookup. The lookup target compares a whole HTTP request
(a fresh guest instance, three spans, a log line, metrics) with one `SELECT` of pgbench: the
memory store's row, where no database is involved at all, is the most any store behind this host
can reach, and its ratio to `pgbench -S` is in the targets table as the host's own ceiling.

{chr(10).join(store_table)}

## Per request, without sockets (criterion; fib in interleaved rounds)

{chr(10).join(per_request_lines)}

Where the CPU of one request goes, and what each change took away: [bench/PROFILE.md](bench/PROFILE.md).
""")
print("\nwrote BENCHMARKS.md and bench/throughput.svg")
