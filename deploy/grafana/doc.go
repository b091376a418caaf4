// Package grafana holds allocd's Grafana dashboard, allocd.json: range usage by band,
// allocation rate and errors (allocd's and gRPC's codes), repair findings and leak
// candidates, master leases, Endpoints changes, etcd request latency and the embedded
// etcd's database size. Import it into Grafana with a Prometheus data source that
// scrapes allocd's --metrics-address.
//
// The package has no code: its test starts allocd, drives it until every labelled
// series exists, scrapes /metrics and fails naming any metric the dashboard queries
// that allocd does not export.
//
//	go test ./deploy/grafana
package grafana
