package codeshape

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryPackageChecksLeaks fails for every folder of the module (not of the modules
// nested in it) with tests whose
// test files do not call leakcheck.MustTestMain (from their TestMain): a goroutine
// left behind by a test of it would go unseen.
func TestEveryPackageChecksLeaks(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	checked := map[string]bool{} // folder with tests: whether one calls MustTestMain
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() && path != root {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module (the bridge, the kube e2e test)
			}
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dir := filepath.Dir(path)
		checked[dir] = checked[dir] || strings.Contains(string(b), "leakcheck.MustTestMain(m")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(checked) < 15 {
		t.Fatalf("found tests in %d folders; the walk did not find the module's tests", len(checked))
	}
	for dir, ok := range checked {
		if !ok {
			rel, _ := filepath.Rel(root, dir)
			t.Errorf("%s has tests but no TestMain calling leakcheck.MustTestMain: add func TestMain(m "+
				"*testing.M) { leakcheck.MustTestMain(m) }", rel)
		}
	}
}
