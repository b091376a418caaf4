#!/usr/bin/env bash
# make etcd-matrix: allocd's tests against etcd servers of the versions users run, as
# processes. For each version given (v3.5.35 v3.6.16 ...) it builds etcd's server from
# the Go module proxy into .bin/etcd-<version> (once; a temporary module that requires
# go.etcd.io/etcd/server/v3 at that version and builds its main package: etcd's own
# go.mod has replace directives, so `go install ...@version` refuses it), then runs the
# tests of every package whose tests start etcd through internal/testing/etcdtest with
# ALLOCD_TEST_ETCD_BINARY set: each etcdtest.New is then a process of that binary on
# free loopback ports (NewCluster's tests skip). Logs in .bin/etcd-matrix/<version>.log.
# Needs only Go and the module proxy. Exit status: non-zero when a version failed.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
root=$PWD
out=$root/.bin/etcd-matrix
mkdir -p "$out"
[ $# -gt 0 ] || { echo "usage: $0 VERSION... (e.g. v3.5.35 v3.6.16)" >&2; exit 2; }

# build VERSION: .bin/etcd-VERSION, built from the module proxy unless it is there.
build() {
	local v=$1 bin=$root/.bin/etcd-$1 tmp
	if [ -x "$bin" ]; then return; fi
	tmp=$(mktemp -d)
	(
		cd "$tmp"
		export GOFLAGS=-mod=mod GOWORK=off
		$GO mod init etcdbuild >/dev/null 2>&1
		$GO get "go.etcd.io/etcd/server/v3@$v"
		$GO build -o "$bin.tmp" go.etcd.io/etcd/server/v3
	) || { rm -rf "$tmp"; echo "building etcd $v from the module proxy failed" >&2; return 1; }
	rm -rf "$tmp"
	mv "$bin.tmp" "$bin"
}

# newer VERSION: the newest patch release of VERSION's minor on the proxy, when newer.
newer() {
	local minor=${1%.*} latest
	latest=$($GO list -m -versions go.etcd.io/etcd/server/v3 2>/dev/null |
		tr ' ' '\n' | grep -E "^${minor//./\\.}\.[0-9]+$" | sort -V | tail -1) || true
	if [ -n "$latest" ] && [ "$latest" != "$1" ]; then echo "$latest"; fi
}

# The packages whose tests start etcd through etcdtest; not the fault suite (its own
# members, make fault) nor cmd/allocd (its only etcdtest user is a make fault test).
pkgs=$(grep -rlE --include='*_test.go' 'etcdtest\.New(Cluster)?\(' . | xargs -n1 dirname | sort -u |
	grep -vE '^\./(internal/testing/fault|cmd/allocd)$')
pkgs="$pkgs ./internal/testing/etcdtest"
echo "packages: $(echo $pkgs)"

summary=()
failed=0
for v in "$@"; do
	echo "== etcd $v"
	if n=$(newer "$v"); then [ -z "$n" ] || echo "note: $n is the newest $v-series release on the module proxy"; fi
	build "$v"
	bin=$root/.bin/etcd-$v
	version=$("$bin" --version)
	echo "${version%%$'\n'*}"
	log=$out/$v.log
	start=$(date +%s)
	rc=0
	ALLOCD_TEST_ETCD_BINARY=$bin $GO test -count=1 -v -timeout 30m $pkgs >"$log" 2>&1 || rc=$?
	secs=$(($(date +%s) - start))
	pass=$(grep -c '^--- PASS' "$log" || true)
	fail=$(grep -c '^--- FAIL' "$log" || true)
	skip=$(grep -c '^--- SKIP' "$log" || true)
	# The tests that ran on the etcd process (etcdtest logs it), by package: go test -v
	# names the test whose output follows (=== RUN, CONT, NAME) and ends a package with ok
	# or FAIL.
	ext=$(awk '/^=== (RUN|CONT|NAME) /{cur=$3; sub(/\/.*/, "", cur)}
		/^(ok|FAIL)[[:space:]]/{pkg++}
		/etcdtest: etcd .* is a process of/ && cur != "" {seen[pkg " " cur]=1}
		END{print length(seen)}' "$log")
	grep -E '^(ok|FAIL|---)[[:space:]]' "$log" | grep -vE '^--- (PASS|SKIP)' || true
	line="etcd $v: $pass passed, $fail failed, $skip skipped, $ext of them on etcd $v; ${secs}s (go test exit $rc; log $log)"
	echo "$line"
	summary+=("$line")
	[ "$rc" -eq 0 ] || failed=1
done
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $failed
