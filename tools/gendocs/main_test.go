package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGenerate checks what make docs relies on: a page per command, the Go flags'
// help on the pages of the commands cobra does not parse flags for, no date line,
// the same pages on every run, and no page left behind by a command that is gone.
func TestGenerate(t *testing.T) {
	first, second := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(first, "allocd_gone.md"), []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{first, second} {
		if err := generate(dir); err != nil {
			t.Fatalf("generate(%s): %v", dir, err)
		}
	}
	pages := read(t, first)
	if _, ok := pages["allocd_gone.md"]; ok {
		t.Error("generate left allocd_gone.md, a page of no command")
	}
	for page, want := range map[string]string{
		"allocd.md":            "--service-cluster-ip-range", // allocd --help: the serving flags
		"allocd_health.md":     "--tls-ca-file",              // cobra's flags, as every command's
		"allocd_get_ranges.md": "allocd get ranges -o wide",  // cobra's examples
		"allocd_release.md":    "--owner",                    // cobra's flags
		"allocd_completion.md": "## allocd completion",
	} {
		if !strings.Contains(pages[page], want) {
			t.Errorf("%s = %q; want it to contain %q", page, pages[page], want)
		}
	}
	again := read(t, second)
	if len(again) != len(pages) || len(pages) < 20 {
		t.Errorf("two runs wrote %d and %d pages; want the same, at least 20", len(pages), len(again))
	}
	for page, text := range pages {
		if strings.Contains(text, "Auto generated") {
			t.Errorf("%s has cobra's date line", page)
		}
		if again[page] != text {
			t.Errorf("%s differs between two runs", page)
		}
	}
}

// read returns the pages of dir by name.
func read(t *testing.T, dir string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pages[filepath.Base(f)] = string(b)
	}
	return pages
}
