# bitpool's image for pipelines that build with Docker or BuildKit; hack/image.sh builds the same
# image without a registry pull (Debian's buildah): one static binary (Rust's musl target) FROM
# scratch, run as uid 65532, entrypoint /bitpool, no shell.
FROM rust:1.95-bookworm AS build
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends musl-tools \
    && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY build.rs ./
COPY src ./src
COPY benches ./benches
ENV CC_x86_64_unknown_linux_musl=musl-gcc
# The release and commit `bitpool --version` names (the build context has no .git).
ARG BITPOOL_VERSION=""
ARG BITPOOL_COMMIT=""
RUN cargo build --release --locked --target x86_64-unknown-linux-musl --bin bitpool

FROM scratch
COPY --from=build --chmod=0555 /src/target/x86_64-unknown-linux-musl/release/bitpool /bitpool
ENV BITPOOL_LOG_FORMAT=json
USER 65532:65532
WORKDIR /
LABEL org.opencontainers.image.title=bitpool org.opencontainers.image.licenses=Apache-2.0
ENTRYPOINT ["/bitpool"]
CMD ["run"]
