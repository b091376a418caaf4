// Package app is the allocd command: serving (package daemon, with its Go flags and
// their grouped help), the container health check (allocd health) and the operator's
// commands (package cli) under one cobra root. cmd/allocd runs it; tools/gendocs writes
// the command line's reference (docs/operators/cli) from NewCommand.
//
//	os.Exit(app.Run(os.Args[1:], os.Stdout, os.Stderr))
package app
