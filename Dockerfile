# The host and its guest component in one slim image (used by deploy/docker-compose.yml with
# `--profile host`). Build from the repository root: docker build -t tutorial-service .

# Build stage: the guest for wasm32-wasip2 and the host, both in release.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN rustup target add wasm32-wasip2 \
    && cargo build --release --locked --target wasm32-wasip2 -p guest \
    && cargo build --release --locked -p host

# Runtime stage: the binary, the component, and a non-root user (uid 10001, `service`) that
# owns only the logs and cache directories.
FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin service \
    && mkdir -p /app/logs /app/cache \
    && chown service /app/logs /app/cache
COPY --from=build /src/target/release/host /usr/local/bin/host
COPY --from=build /src/target/wasm32-wasip2/release/guest.wasm /app/guest.wasm
ENV GUEST_COMPONENT=/app/guest.wasm \
    GUEST_CACHE_DIR=/app/cache \
    LOG_FILE=/app/logs/app.log \
    BIND=0.0.0.0 \
    PORT=8080
WORKDIR /app
USER 10001
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/host"]
