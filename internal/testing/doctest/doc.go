// Package doctest keeps allocd's documentation true: README.md and every markdown file
// under docs/. Its test runs every marked block of commands against a real allocd and
// compares what each command prints with what the doc shows, and fails on a marked
// block that no test claims, on a relative link whose file or #anchor does not exist
// (GitHub's anchor rules), and on a heading that a file has twice.
//
// A marked block is the text between two comments, its name unique across the docs:
//
//	<!-- cli-tour:begin -->
//	```console
//	$ go run ./cmd/allocd --repair-leak-grace 0s
//	$ allocd get ranges
//	NAME          KIND        ...
//	```
//	<!-- cli-tour:end -->
//
// In its ```console blocks "$ " starts a command (a trailing backslash continues it) and
// the lines up to the next command are its output. `go run ./cmd/allocd FLAGS` starts
// allocd (in the test's process, on free ports); the other commands run in bash with
// this allocd's address for 127.0.0.1:8080 and 127.0.0.1:9090. The test's table of
// claims names every block and how it runs; UPDATE_DOCS=1 writes a run's outputs into
// the docs instead of comparing them.
//
// This package holds the markdown side (Files, Blocks, Steps, Rewrite, Links, Slug,
// CheckLinks); the test holds the claims and runs them.
package doctest
