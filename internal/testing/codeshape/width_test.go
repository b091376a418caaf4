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

// tooWide are files of package endpoints and of the server's endpoints services whose
// lines are still wider than maxWidth: each leaves this list once they are wrapped, and
// the list is to end empty.
var tooWide = map[string]bool{
	"endpoints/codec.go": true, "endpoints/codec_test.go": true, "endpoints/controller.go": true,
	"endpoints/epterm.go": true, "endpoints/slice_test.go": true, "endpoints/slicedesired.go": true,
	"endpoints/slicehelpers_test.go": true, "endpoints/slicehints.go": true,
	"endpoints/slicelarge_test.go": true, "endpoints/slicemetrics.go": true,
	"endpoints/sliceoutcome_test.go": true, "endpoints/slicereconcile.go": true,
	"endpoints/sliceterm.go": true, "endpoints/term.go": true,
	"server/endpointsconv.go": true, "server/endpointsconv_test.go": true, "server/endpointsvc.go": true,
}

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
