# syntax=docker/dockerfile:1
#
# The deepseed binary: server (serve, migrate, import), demo loader and
# node collector (collect). Built with cgo because the collector reaches
# NVML through go-nvml, which loads libnvidia-ml.so with dlopen; the NVIDIA
# container runtime mounts that library into the container when a GPU is
# reserved. The runtime image is Debian slim (glibc, and curl for the
# healthcheck).

ARG GO_VERSION=1.26
ARG DEBIAN_RELEASE=bookworm

FROM golang:${GO_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=1 go build -trimpath \
      -ldflags "-s -w -X main.Version=${VERSION}" \
      -o /out/deepseed ./cmd/deepseed

FROM debian:${DEBIAN_RELEASE}-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/deepseed --create-home deepseed \
 && install -d -o deepseed -g deepseed /var/lib/deepseed/data /var/lib/deepseed/spool
COPY --from=build /out/deepseed /usr/local/bin/deepseed
USER deepseed
WORKDIR /var/lib/deepseed
# The image's user is not root, so without these the data and spool
# directories would default to its home's state directories; they are the
# directories created above, where compose mounts its volumes.
ENV DEEPSEED_LISTEN=:8080 \
    DEEPSEED_DATA_DIR=/var/lib/deepseed/data \
    DEEPSEED_SPOOL_DIR=/var/lib/deepseed/spool
EXPOSE 8080 9400
ENTRYPOINT ["/usr/local/bin/deepseed"]
CMD ["serve"]
