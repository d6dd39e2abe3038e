# bitpool's image for pipelines that build with Docker or BuildKit; hack/image.sh builds the same
# images without a registry pull (Debian's buildah): one static binary (Rust's musl targets) FROM
# scratch, run as uid 65532, entrypoint /bitpool, no shell. Both platforms are cross-compiled on
# an amd64 builder:
#
#   docker buildx build --platform linux/amd64,linux/arm64 .
FROM --platform=$BUILDPLATFORM rust:1.95-bookworm AS build
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends musl-tools gcc-aarch64-linux-gnu \
    && rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY build.rs ./
COPY src ./src
COPY benches ./benches
ENV CC_x86_64_unknown_linux_musl=musl-gcc \
    CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc
# The release and commit `bitpool --version` names (the build context has no .git).
ARG BITPOOL_VERSION=""
ARG BITPOOL_COMMIT=""
ARG TARGETARCH
RUN case "$TARGETARCH" in \
      amd64) target=x86_64-unknown-linux-musl ;; \
      arm64) target=aarch64-unknown-linux-musl ;; \
      *) echo "no build for $TARGETARCH: linux/amd64 and linux/arm64 only" >&2; exit 1 ;; \
    esac \
    && cargo build --release --locked --target "$target" --bin bitpool \
    && cp "target/$target/release/bitpool" /bitpool

FROM scratch
COPY --from=build --chmod=0555 /bitpool /bitpool
ENV BITPOOL_LOG_FORMAT=json
USER 65532:65532
WORKDIR /
LABEL org.opencontainers.image.title=bitpool org.opencontainers.image.licenses=Apache-2.0
ENTRYPOINT ["/bitpool"]
CMD ["run"]
