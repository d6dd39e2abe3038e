# Builds the single bitpool binary into a small image.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin bitpool

FROM debian:bookworm-slim
COPY --from=build /src/target/release/bitpool /usr/local/bin/bitpool
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/bitpool"]
