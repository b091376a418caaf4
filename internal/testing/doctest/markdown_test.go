package doctest

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestSlug(t *testing.T) {
	for _, tc := range []struct{ heading, want string }{
		{"What it does", "what-it-does"},
		{"Operator tour: the allocd command line", "operator-tour-the-allocd-command-line"},
		{"Security: TLS, client certificates, authorization",
			"security-tls-client-certificates-authorization"},
		{"Running for months: compaction, quota, defragmentation, NOSPACE",
			"running-for-months-compaction-quota-defragmentation-nospace"},
		{"`allocd get` and `-o json`", "allocd-get-and--o-json"},
		{"The [Go client](go-client.md) for shims", "the-go-client-for-shims"},
		{"Flags & errors", "flags--errors"},
		{"snake_case names", "snake_case-names"},
		{"1.5 % of calls (p99)", "15--of-calls-p99"},
		{"Ünïcode <em>ü</em>", "ünïcode-ü"},
		{"  Trailing space  ", "trailing-space"},
	} {
		if got := Slug(tc.heading); got != tc.want {
			t.Errorf("Slug(%q) = %q; want %q", tc.heading, got, tc.want)
		}
	}
}

func TestHeadings(t *testing.T) {
	text := "# A\n\n## A\n\n```sh\n# A comment, not a heading\n```\n\n## A ##\n\n#NoSpace\n\n### A-1\n"
	var got []string
	for _, h := range Headings(text) {
		got = append(got, h.Anchor)
	}
	// github-slugger: a, a-1, a-2, then "A-1" is taken and becomes a-1-1.
	want := []string{"a", "a-1", "a-2", "a-1-1"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Headings(%q) anchors = %q; want %q", text, got, want)
	}
}

// TestCheckLinks plants good and broken links and checks that CheckLinks reports
// exactly the broken ones.
func TestCheckLinks(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("Makefile", "all:\n")
	write("docs/ops/guide.md", "# Guide\n\n## Two words\n\n## Two words\n\n<a name=\"manual\"></a>\n")
	for _, tc := range []struct {
		link string
		want string // in the problem; "" for none
	}{
		{"docs/ops/guide.md", ""},
		{"docs/ops/guide.md#two-words", ""},
		{"docs/ops/guide.md#two-words-1", ""},
		{"docs/ops/guide.md#manual", ""},
		{"docs/ops/", ""},
		{"Makefile", ""},
		{"#local", ""},
		{"https://example.com/nowhere.md#x", ""},
		{"docs/ops/guide.md#two-words-2", "no heading with the anchor #two-words-2"},
		{"docs/ops/gone.md", "docs/ops/gone.md does not exist"},
		{"#nowhere", "README.md has no heading with the anchor #nowhere"},
		{"Makefile#all", "not markdown"},
		{"../outside.md", "leaves the repository"},
	} {
		write("README.md", "# Local\n\nSee [it]("+tc.link+").\n\n`[code](gone.md)`\n\n"+
			"```\n[fenced](gone.md)\n```\n")
		got := strings.Join(CheckLinks(root, []string{"README.md"}), "\n")
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("CheckLinks of a link to %s = %q; want %q", tc.link, got, tc.want)
		}
	}
}

func TestBlocks(t *testing.T) {
	text := "a\n<!-- one:begin -->\nbody\n<!-- one:end -->\n<!--two:begin-->\nx\n<!-- two:end -->\n" +
		"<!-- three:end -->\n<!-- four:begin -->\n<!-- five:begin -->\n" +
		"`<!-- span:begin -->`\n```\n<!-- fenced:begin -->\n```\n"
	blocks, errs := Blocks("f.md", text)
	var names []string
	for _, b := range blocks {
		names = append(names, b.Name)
	}
	if !reflect.DeepEqual(names, []string{"one", "two"}) || blocks[0].Body != "\nbody\n" ||
		blocks[0].Line != 2 {
		t.Errorf("Blocks(%q) = %+v; want one (line 2, body \"\\nbody\\n\") and two", text, blocks)
	}
	var got []string
	for _, e := range errs {
		got = append(got, e.Error())
	}
	want := []string{"f.md:8: three ends where it did not begin", "f.md:10: five begins inside four (line 9)",
		"f.md:9: four has no end marker"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Blocks(%q) errors = %q; want %q", text, got, want)
	}
}

func TestStepsAndRewrite(t *testing.T) {
	body := "Intro.\n\n```console\n$ echo a\nold a\n$ echo b \\\n  c  # addresses vary\n$ true\n```\n" +
		"\nText.\n\n" +
		"```console\n$ echo d\nold d\nold d 2\n```\n"
	steps := Steps(body)
	want := []Step{{Cmd: "echo a", Want: "old a\n"}, {Cmd: "echo b \\\n  c", Varies: true}, {Cmd: "true"},
		{Cmd: "echo d", Want: "old d\nold d 2\n"}}
	if !reflect.DeepEqual(steps, want) {
		t.Fatalf("Steps(%q) = %+v; want %+v", body, steps, want)
	}
	if got := Rewrite(body, []string{"old a\n", "", "", "old d\nold d 2\n"}); got != body {
		t.Errorf("Rewrite with the same outputs = %q; want the body unchanged, %q", got, body)
	}
	got := Rewrite(body, []string{"new a", "b c\n", "", "new d\n"})
	wantBody := "Intro.\n\n```console\n$ echo a\nnew a\n$ echo b \\\n  c  # addresses vary\nb c\n$ true\n" +
		"```\n\nText.\n\n" +
		"```console\n$ echo d\nnew d\n```\n"
	if got != wantBody {
		t.Errorf("Rewrite = %q; want %q", got, wantBody)
	}
}

func TestReplace(t *testing.T) {
	text := "x <!-- a:begin -->old<!-- a:end --> y"
	got, err := Replace(text, "a", "new")
	if err != nil || got != "x <!-- a:begin -->new<!-- a:end --> y" {
		t.Errorf("Replace(%q) = %q, %v", text, got, err)
	}
	if _, err := Replace(text, "b", "new"); err == nil {
		t.Errorf("Replace(%q, b) = nil error; want no block b", text)
	}
}
