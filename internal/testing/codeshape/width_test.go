package codeshape

import (
	"bufio"
	"os"
	"strings"
	"testing"
)

// maxWidth is the widest a line of Go may be, a tab counting tabWidth columns: what a
// reviewer reads without scrolling.
const (
	maxWidth = 110
	tabWidth = 4
)

// tooWide are files whose lines may be wider than maxWidth: none. A file may stand here
// only while the branch that wraps its lines is open.
var tooWide = map[string]bool{}

// TestLineWidth fails for every line of the module's Go files, tests included, wider
// than maxWidth; generated code aside.
func TestLineWidth(t *testing.T) {
	goFiles(t, func(rel, path string) {
		if strings.HasSuffix(rel, ".pb.go") || tooWide[rel] {
			return
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		s := bufio.NewScanner(f)
		s.Buffer(nil, 1<<20)
		for n := 1; s.Scan(); n++ {
			if w := len(strings.ReplaceAll(s.Text(), "\t", strings.Repeat(" ", tabWidth))); w > maxWidth {
				t.Errorf("%s:%d is %d columns wide; at most %d (a tab counts %d)", rel, n, w, maxWidth,
					tabWidth)
			}
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
	})
}
