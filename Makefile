# allocd. `make test` is what CI runs (through .ci/run); `make test-unit` is the quick
# loop of every day; `make run` starts allocd on an embedded etcd; `make bench` measures
# against the ceilings of the same run.

GO ?= go
BIN := $(CURDIR)/.bin
# Code generators, pinned, installed from the Go module proxy into .bin (never into the
# main module's requirements, so that a shim importing client/ does not inherit them).
BUF_VERSION := v1.70.0
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
GRPCURL_VERSION := v1.9.4

export PATH := $(BIN):$(PATH)

.PHONY: all run build test test-unit vet fmt-check lint proto proto-check docs docs-check compose-check certs tools bench scale mass-release soak cluster fault etcd-matrix clean bridge bridge-test kube-bins kube-e2e kube-numbers kube-webhook-numbers

all: build

run:
	$(GO) run ./cmd/allocd

build:
	$(GO) build -o bin/allocd ./cmd/allocd

# The fault suite's 15-second run goes last and alone: it loads the machine with six
# processes and faults, which would skew the timing of the other packages' tests.
test: vet fmt-check lint proto-check docs-check compose-check $(BIN)/grpcurl
	$(GO) test -count=1 -timeout 20m $$($(GO) list ./... | grep -v '/internal/testing/fault$$')
	cd bridge && $(GO) vet ./... && $(GO) test -count=1 -timeout 10m ./...
	$(GO) test -count=1 -timeout 10m ./internal/testing/fault

# test-unit is the everyday loop, under a minute on 2 cores with a warm build cache:
# go test -short skips what builds or runs binaries and other processes, the fault
# runs, and the tests that wait out seconds of real time (lease TTLs, probes, timeouts,
# restarts); the quick tests against an embedded etcd stay, and every package's leak
# check. -count=1: the tests run every time, as in CI (no cached results).
test-unit:
	$(GO) test -short -count=1 ./...

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

lint: $(BIN)/buf
	$(BIN)/buf lint

# proto writes the Go code beside the protos, and server/allocd.binpb: the compiled API
# with its comments, which server reflection serves so that `grpcurl describe` shows them.
proto: $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc
	$(BIN)/buf generate
	$(BIN)/buf build --exclude-imports -o server/allocd.binpb

# proto-check regenerates into a temporary directory and fails if the committed code differs.
proto-check: $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	$(BIN)/buf generate -o $$tmp && $(BIN)/buf build --exclude-imports -o $$tmp/allocd.binpb && \
	if ! diff -r -q $$tmp/proto/allocd/v1 proto/allocd/v1 -x '*.proto' >/dev/null || ! cmp -s $$tmp/allocd.binpb server/allocd.binpb; then \
		diff -r $$tmp/proto/allocd/v1 proto/allocd/v1 -x '*.proto' | head -40; \
		echo "generated code is stale: run make proto and commit"; exit 1; \
	else echo "generated code is up to date"; fi

# docs writes the command line's reference, a page per command, from the root command
# that allocd runs (cobra's doc generator: tools/gendocs).
docs:
	$(GO) run ./tools/gendocs -out docs/operators/cli

# docs-check regenerates the reference into a temporary directory and fails if the
# committed pages differ (a page added, changed or left behind).
docs-check:
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	$(GO) run ./tools/gendocs -out $$tmp && \
	if ! diff -r -q $$tmp docs/operators/cli >/dev/null; then \
		diff -r $$tmp docs/operators/cli | head -40; \
		echo "the command line's reference is stale: run make docs and commit"; exit 1; \
	else echo "the command line's reference is up to date"; fi

# compose-check validates docker-compose.yml offline (Debian's docker-compose package).
compose-check:
	@if [ ! -f docker-compose.yml ]; then echo "no docker-compose.yml"; \
	elif command -v docker-compose >/dev/null; then docker-compose -f docker-compose.yml config -q && echo "docker-compose.yml is valid"; \
	else echo "docker-compose not installed (apt-get install docker-compose): cannot validate docker-compose.yml"; exit 1; fi

# certs writes a throwaway CA and certificates (server, shim, operator, admin) into
# deploy/certs for docker compose and for trying TLS by hand; git ignores them.
certs:
	$(GO) run ./tools/mkcerts -out deploy/certs

tools: $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/grpcurl

$(BIN)/buf:
	GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
$(BIN)/protoc-gen-go:
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
$(BIN)/protoc-gen-go-grpc:
	GOBIN=$(BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
$(BIN)/grpcurl:
	GOBIN=$(BIN) $(GO) install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)

# cluster: etcd (allocd-1's embedded one) and two allocd replicas on loopback; Ctrl-C stops.
cluster:
	bash scripts/cluster.sh

# fault: the longer fault runs, outside `make test`: etcd leader crashes while master
# leases are renewed (3-member embedded cluster); the leading allocd killed with SIGKILL
# while Pod events flow to the Endpoints controller; the fault suite (internal/testing/fault):
# 3 etcd members and 3 allocd replicas as processes under kills, pauses and network
# faults for ALLOCD_FAULT_DURATION (5m), its history checked.
fault:
	ALLOCD_FAULT_TESTS=1 $(GO) test -count=1 -v -run 'TestRenewThroughLeaderChange|TestStaleLeaderRevokes|TestClusterLeaderCrash|TestEndpointsLeaderKill' ./masterlease/ ./internal/testing/etcdtest/ ./cmd/allocd/
	ALLOCD_FAULT_TESTS=1 ALLOCD_FAULT_DURATION=$${ALLOCD_FAULT_DURATION:-5m} ALLOCD_FAULT_ELECTION_MS=$${ALLOCD_FAULT_ELECTION_MS:-1000} ALLOCD_FAULT_PAUSE=$${ALLOCD_FAULT_PAUSE:-5s} $(GO) test -count=1 -v -timeout 30m -run TestFaultSuite ./internal/testing/fault/

# etcd-matrix: the tests of every package that starts etcd through internal/testing/etcdtest,
# against real etcd servers of the versions users run, as processes: each built once from
# the Go module proxy into .bin/etcd-<version> (scripts/etcd-matrix.sh; logs in
# .bin/etcd-matrix). Not in `make test`: a few minutes per version.
ETCD_MATRIX_VERSIONS ?= v3.5.35 v3.6.16
etcd-matrix:
	GO=$(GO) bash scripts/etcd-matrix.sh $(ETCD_MATRIX_VERSIONS)

# The last step measures both endpoint controllers as an operator sees them: allocd as its
# own process, fed and watched over gRPC (tools/epbench; a few minutes a run).
bench:
	$(GO) run ./tools/bench
	$(GO) test -run '^$$' -bench BenchmarkRepairPass -benchtime 3x ./repair/
	$(GO) test -run '^$$' -bench BenchmarkInitialSync -benchtime 3x ./endpoints/
	$(GO) test -run '^$$' -bench BenchmarkEndpointsFeed -benchtime 1x ./cmd/allocd/daemon/
	$(GO) run ./tools/epbench -runs $${EPBENCH_RUNS:-3}

# scale: allocd as its store grows to 1,000,000 allocations (a /11, fsync on): the rate and
# CPU of Allocate+Release cycles over 5 minutes (every compaction in the window counted),
# Allocate's CPU against a held call and etcd's floor, RSS (allocd, and etcd alone on the same
# data), the data directory, a repair pass, kill -9 → SERVING on the embedded etcd and on an
# external one, at 0, 10k, 100k, 300k and 1M, in one table (docs/contributors/scale.md). About
# an hour on the 2-core build machine; CPU and heap profiles of allocd at 1M go to .bin/scale.
# Not in `make test`.
scale:
	mkdir -p .bin/scale
	$(GO) run ./tools/scale -profile-dir .bin/scale

# mass-release: a namespace of 100,000 Services deleted: 100,000 owners filled, then released at
# once by 64 clients while 16 keep allocating (and releasing); per 1-s window, the Allocates,
# the tombstones waiting and etcd's database (docs/contributors/scale.md, "Mass release").
# A few minutes on the 2-core build machine; not in `make test`.
mass-release:
	$(GO) run ./tools/scale massrelease

# soak: 1,000,000 Allocate+Release cycles against allocd on its embedded etcd (fsync on),
# the database size every 100,000: with the default --etcd-compaction-interval (5m), then
# with compaction off. About 5-10 minutes each on the 2-core build machine; not in `make test`.
soak:
	$(GO) run ./tools/soak -etcd-compaction-interval 5m
	$(GO) run ./tools/soak -etcd-compaction-interval 0

# bridge: allocd-bridge, the bridge between allocd and a Kubernetes cluster (its own
# module, bridge/, so that client/ and allocd do not build client-go); bridge-test runs
# its unit tests and checks it with vet and gofmt.
bridge:
	cd bridge && $(GO) build -o $(CURDIR)/bin/allocd-bridge ./cmd/allocd-bridge
bridge-test:
	cd bridge && $(GO) vet ./... && $(GO) test -count=1 ./...
	cd test/kube && $(GO) vet ./...

# kube-e2e: the bridge against real Kubernetes. kube-apiserver and kube-controller-manager
# KUBE_VERSION are built from the Go module proxy (k8s.io/kubernetes with its staging
# modules replaced by their published releases: test/kube/k8s/go.mod pins them) into
# .bin/<name>-KUBE_VERSION, once; a new KUBE_VERSION builds anew. Go 1.26 builds v1.37
# (its go.mod says go 1.26.0); no other toolchain is needed. The test (test/kube, a
# module of its own) starts etcd, two clusters (the reference with
# kube-controller-manager's endpoint controller, the other with allocd and the bridge),
# feeds both the same objects and compares. Logs of every process: .bin/kube-e2e-logs.
# The first build takes about 15 minutes on the 2-core build machine, a run about 10.
KUBE_VERSION := v1.37.2
KUBE_BIN := $(BIN)/kube-$(KUBE_VERSION)
kube-bins: $(KUBE_BIN)/kube-apiserver $(KUBE_BIN)/kube-controller-manager
$(KUBE_BIN)/kube-apiserver $(KUBE_BIN)/kube-controller-manager: test/kube/k8s/go.mod test/kube/k8s/go.sum
	@grep -q 'k8s.io/kubernetes $(KUBE_VERSION)$$' test/kube/k8s/go.mod || \
		{ echo "test/kube/k8s/go.mod does not pin k8s.io/kubernetes $(KUBE_VERSION)"; exit 1; }
	cd test/kube/k8s && $(GO) build -o $@ k8s.io/kubernetes/cmd/$(notdir $@)
kube-e2e: kube-bins
	$(GO) build -o $(KUBE_BIN)/allocd ./cmd/allocd
	$(GO) build -o $(KUBE_BIN)/mkcerts ./tools/mkcerts
	cd bridge && $(GO) build -o $(KUBE_BIN)/allocd-bridge ./cmd/allocd-bridge
	cd test/kube && KUBE_E2E_BIN=$(KUBE_BIN) KUBE_E2E_LOGS=$(BIN)/kube-e2e-logs KUBE_E2E_NUMBERS=$(KUBE_E2E_NUMBERS) \
		KUBE_E2E_WEBHOOK_NUMBERS=$(KUBE_E2E_WEBHOOK_NUMBERS) \
		$(GO) test -count=1 -timeout 90m -v $(KUBE_E2E_FLAGS) ./...

# kube-numbers: the figures of bridge/README.md, side by side on this machine (TestNumbers:
# initial sync of KUBE_E2E_SERVICES Services x KUBE_E2E_PODS_PER_SERVICE Pods, readiness
# flips at 10 and 200/s; TestFlips: 50 flips at KUBE_E2E_FLIP_RATES, default 5/s, hop by
# hop).
kube-numbers:
	$(MAKE) kube-e2e KUBE_E2E_FLAGS="-run 'TestNumbers|TestFlips'" KUBE_E2E_NUMBERS=1

# kube-webhook-numbers: Service creates/s and p50 / p99 from 16 clients at 0, 5,000 and
# 10,000 existing Services, kube-apiserver alone against kube-apiserver with allocd's
# webhook, side by side on one etcd, and the webhook's own latency (TestWebhookNumbers);
# one markdown table at the end of the log and in .bin/kube-e2e-logs. KUBE_E2E_LEVELS,
# KUBE_E2E_CREATES, KUBE_E2E_RUNS, KUBE_E2E_SIDES=alone and KUBE_E2E_PROFILE=1 (CPU
# profiles of every process, with their top functions) narrow or widen it.
kube-webhook-numbers:
	$(MAKE) kube-e2e KUBE_E2E_FLAGS="-run TestWebhookNumbers" KUBE_E2E_WEBHOOK_NUMBERS=1

clean:
	rm -rf bin .bin allocd-data cluster-data
