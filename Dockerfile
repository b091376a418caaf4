# syntax=docker/dockerfile:1
#
# allocd: a static binary on distroless, run as a non-root user.
#
#   docker build -t allocd .
#   docker run --rm -p 8080:8080 allocd                      # embedded etcd in /var/lib/allocd
#   docker run --rm allocd --etcd-servers http://etcd:2379 --grpc-address 0.0.0.0:8080
#
# The health check asks the gRPC health service (grpc.health.v1) of the allocd in the
# container: `allocd health` exits 0 when it answers SERVING. With TLS (--tls-cert-file),
# override it with `allocd health --tls-ca-file CA` (docker-compose.yml does); health
# needs no client certificate.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
# Module downloads first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=""
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w -X github.com/allocd/allocd/cmd/allocd/app.version=${VERSION}" \
        -o /out/allocd ./cmd/allocd \
    && mkdir -p /out/data

# distroless static: CA certificates, tzdata, /etc/passwd with nonroot (65532); no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/allocd /allocd
# The embedded etcd's data directory, owned by the user allocd runs as.
COPY --from=build --chown=65532:65532 /out/data /var/lib/allocd
USER 65532:65532
VOLUME ["/var/lib/allocd"]
# 8080: gRPC API (allocd.v1, health, reflection). 9090: Prometheus /metrics.
EXPOSE 8080 9090
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["/allocd", "health", "--server", "127.0.0.1:8080"]
ENTRYPOINT ["/allocd"]
# allocd listens on loopback by default; in a container it must listen on every
# interface to be reachable. Arguments given to `docker run` replace these.
CMD ["--grpc-address=0.0.0.0:8080", "--metrics-address=0.0.0.0:9090", "--data-dir=/var/lib/allocd"]
