# The guest and the host share one target directory and its lock: build them one after another.
CARGO ?= cargo
GUEST_TARGET := wasm32-wasip2
# Guests the integration tests run: the real one and the fixtures under tests/fixtures.
GUEST_PACKAGES := -p guest -p panicking-guest -p minimal-guest -p command-component -p hostile-guest

.PHONY: build guests target run test fmt lint bench clean

## build: the guest component (release, wasm32-wasip2) and the host.
build: guests
	$(CARGO) build -p host

## target: the wasm target; rustup does not install a toolchain file's targets by itself here.
target:
	rustup target add $(GUEST_TARGET)

## guests: every guest component, the test fixtures included.
guests: target
	$(CARGO) build --release --target $(GUEST_TARGET) $(GUEST_PACKAGES)

## run: build, then serve on port 8080.
run: build
	$(CARGO) run -p host

## test: the guest's native tests, the host's unit tests and the end-to-end tests.
test: build
	$(CARGO) test --workspace
	$(MAKE) lint
	$(CARGO) fmt --all -- --check

## fmt: format every crate.
fmt:
	$(CARGO) fmt --all

## lint: clippy on every target, warnings as errors, natively and for the guest's wasm edge.
lint: target
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --target $(GUEST_TARGET) $(GUEST_PACKAGES) -- -D warnings

## bench: release builds, every contender under wrk, criterion; writes BENCHMARKS.md (not in CI).
bench:
	bash bench/run.sh

clean:
	$(CARGO) clean
