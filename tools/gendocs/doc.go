// Command gendocs writes the reference of the allocd command line into a directory
// (`make docs`: docs/operators/cli), one markdown page per command, with cobra's doc
// generator over the root command that allocd runs (package cmd/allocd/app):
//
//	go run ./tools/gendocs -out docs/operators/cli
//
// The serving flags and allocd health's are Go flags that cobra does not parse: a
// command with DisableFlagParsing gets its own --help output on its page, so that the
// root page is the reference of allocd's flags. The output is deterministic (no
// "Auto generated ... on <date>" line); `make test` fails when the committed pages
// differ from what gendocs writes.
package main
