# The guest and the host share one target directory and its lock: build them one after another.
CARGO ?= cargo
GUEST_TARGET := wasm32-wasip2
# Guests the integration tests run: the real one, built alone (it is no_std on wasm32, and built
# with the std fixtures the wasi crate's features would unify into std), and the fixtures under
# tests/fixtures.
FIXTURE_PACKAGES := -p panicking-guest -p minimal-guest -p command-component -p hostile-guest -p orders-guest -p otel-guest

.PHONY: build guests target run test fmt lint bench clean deploy-check conformance load live-checks

# The checks' Python-packaged tools (schemathesis, locust, hadolint) live in a virtualenv here.
VENV := target/venv
# The service the live checks and the load scenario talk to.
SERVICE_URL ?= http://localhost:8080
CONFORMANCE_SECONDS ?= 60
LOAD_SECONDS ?= 20

## build: the guest component (release, wasm32-wasip2) and the host.
build: guests
	$(CARGO) build -p host

## target: the wasm target; rustup does not install a toolchain file's targets by itself here.
target:
	rustup target add $(GUEST_TARGET)

## guests: every guest component, the test fixtures included.
guests: target
	$(CARGO) build --release --target $(GUEST_TARGET) -p guest
	$(CARGO) build --release --target $(GUEST_TARGET) $(FIXTURE_PACKAGES)

## run: build, then serve on port 8080.
run: build
	$(CARGO) run -p host

## test: the guest's native tests, the host's unit and end-to-end tests (the dashboard's against
## a real Prometheus), lint, format, the deploy files, and the live checks.
test: build
	$(CARGO) test --workspace
	$(MAKE) lint
	$(CARGO) fmt --all -- --check
	$(MAKE) deploy-check
	$(MAKE) live-checks

## deploy-check: the Prometheus configuration, the compose file and the Dockerfile, checked by
## their own tools.
deploy-check: $(VENV)/installed
	promtool check config deploy/prometheus.yml
	docker-compose -f deploy/docker-compose.yml config --quiet
	$(VENV)/bin/hadolint Dockerfile

## conformance: schemathesis, with docs/openapi.yaml, against the host at SERVICE_URL.
conformance: $(VENV)/installed
	$(VENV)/bin/schemathesis run docs/openapi.yaml --url $(SERVICE_URL) --checks all \
		--max-time $(CONFORMANCE_SECONDS) --generation-database none

## load: the locust scenario against the host at SERVICE_URL for LOAD_SECONDS; fails on any failure.
load: $(VENV)/installed
	LOAD_SECONDS=$(LOAD_SECONDS) $(VENV)/bin/locust -f tests/live/locustfile.py --headless \
		--host $(SERVICE_URL) --run-time $(LOAD_SECONDS)s --only-summary

## live-checks: a host on a free port, then conformance (60 s) and load (20 s) against it.
live-checks: build $(VENV)/installed
	bash tests/live/run.sh

$(VENV)/installed: tests/live/requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/live/requirements.txt
	touch $@

## fmt: format every crate.
fmt:
	$(CARGO) fmt --all

## lint: clippy on every target, warnings as errors, natively and for the guests' wasm edge; the
## no_std guests alone (built with the std guests, the wasi crate's features unify into std).
lint: target
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --target $(GUEST_TARGET) -p guest -- -D warnings
	$(CARGO) clippy --target $(GUEST_TARGET) $(FIXTURE_PACKAGES) -- -D warnings
	$(CARGO) clippy --target $(GUEST_TARGET) -p hello-nostd -- -D warnings

## bench: release builds, every contender under wrk, criterion; writes BENCHMARKS.md (not in CI).
bench:
	bash bench/run.sh

clean:
	$(CARGO) clean
