package main

import (
	"io"
	"os"

	"github.com/allocd/allocd/cmd/allocd/app"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is allocd with args (package app); it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int { return app.Run(args, stdout, stderr) }
