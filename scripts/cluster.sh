#!/usr/bin/env bash
# make cluster: the docker-compose topology without Docker, on loopback.
#   allocd-1: embedded etcd (client 127.0.0.1:12379), gRPC 127.0.0.1:8081, metrics 127.0.0.1:9091
#   allocd-2: uses allocd-1's etcd,                   gRPC 127.0.0.1:8082, metrics 127.0.0.1:9092
# Data in ./cluster-data. Ctrl-C (or SIGTERM) stops both. Extra arguments go to both replicas.
set -euo pipefail
cd "$(dirname "$0")/.."
go build -o bin/allocd ./cmd/allocd
mkdir -p cluster-data
ranges=(--service-cluster-ip-range 10.96.0.0/16,fd00:10:96::/108)
bin/allocd --data-dir cluster-data/allocd-1 "${ranges[@]}" \
	--embedded-etcd-client-address 127.0.0.1:12379 --embedded-etcd-peer-address 127.0.0.1:12380 \
	--grpc-address 127.0.0.1:8081 --metrics-address 127.0.0.1:9091 "$@" &
one=$!
# Stop the replica that uses the etcd first, then the one that holds it.
stop() {
	trap - INT TERM EXIT
	[ -n "${two:-}" ] && kill -TERM "$two" 2>/dev/null && wait "$two" || true
	kill -TERM "$one" 2>/dev/null && wait "$one" || true
}
trap stop INT TERM EXIT
until bin/allocd health --server 127.0.0.1:8081 >/dev/null 2>&1; do
	kill -0 $one 2>/dev/null || { echo "allocd-1 did not start" >&2; exit 1; }
	sleep 0.2
done
bin/allocd --etcd-servers http://127.0.0.1:12379 "${ranges[@]}" \
	--grpc-address 127.0.0.1:8082 --metrics-address 127.0.0.1:9092 "$@" &
two=$!
until bin/allocd health --server 127.0.0.1:8082 >/dev/null 2>&1; do
	kill -0 $two 2>/dev/null || { echo "allocd-2 did not start" >&2; exit 1; }
	sleep 0.2
done
echo "allocd-1 on 127.0.0.1:8081 and allocd-2 on 127.0.0.1:8082 share one etcd; Ctrl-C stops both" >&2
wait
