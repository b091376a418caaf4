package doctest

import (
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// Heading is a heading of a markdown file (an ATX heading: "## Text").
type Heading struct {
	Line   int // from 1
	Text   string
	Anchor string // GitHub's: Slug, with -1, -2, ... for the second, third, ...
}

// Link is a relative link of a markdown file: [text](Target).
type Link struct {
	Line   int
	Target string
}

var (
	atxHeading = regexp.MustCompile(`^ {0,3}#{1,6}\s+(.*?)(\s+#+)?\s*$`)
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
	inlineLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	linkText   = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag    = regexp.MustCompile(`<[^>]+>`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	scheme     = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
)

// textLines calls f for each line of text outside fenced code blocks, with its number.
func textLines(text string, f func(n int, line string)) {
	fence := ""
	for i, line := range strings.Split(text, "\n") {
		t := strings.TrimLeft(line, " ")
		switch {
		case fence == "" && (strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~")):
			fence = t[:3]
		case fence != "" && strings.HasPrefix(t, fence):
			fence = ""
		case fence == "":
			f(i+1, line)
		}
	}
}

// Headings returns the headings of text with their anchors, as GitHub makes them
// (github-slugger: the second "Foo" is foo-1).
func Headings(text string) []Heading {
	var hs []Heading
	occurrences := map[string]int{}
	textLines(text, func(n int, line string) {
		m := atxHeading.FindStringSubmatch(line)
		if m == nil {
			return
		}
		slug := Slug(m[1])
		a := slug
		for {
			if _, taken := occurrences[a]; !taken {
				break
			}
			occurrences[slug]++
			a = fmt.Sprintf("%s-%d", slug, occurrences[slug])
		}
		occurrences[a] = 0
		hs = append(hs, Heading{Line: n, Text: m[1], Anchor: a})
	})
	return hs
}

// Slug is GitHub's anchor of a heading (github-slugger over the rendered text): the
// text of code spans and links kept, tags dropped, lower case, every character but
// letters, numbers, marks, '-' and '_' (connector punctuation) dropped, each space a '-'.
func Slug(heading string) string {
	s := linkText.ReplaceAllString(strings.TrimSpace(heading), "$1")
	s = htmlTag.ReplaceAllString(s, "")
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.IsMark(r) ||
			unicode.Is(unicode.Pc, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Anchors returns every anchor of text: its headings' and its HTML anchors (<a name=...>).
func Anchors(text string) map[string]bool {
	as := map[string]bool{}
	for _, h := range Headings(text) {
		as[h.Anchor] = true
	}
	for _, m := range htmlAnchor.FindAllStringSubmatch(text, -1) {
		as[m[1]] = true
	}
	return as
}

// Links returns the relative links of text: inline links and images outside code
// blocks and code spans whose target has no scheme (http:, mailto:).
func Links(text string) []Link {
	var ls []Link
	textLines(text, func(n int, line string) {
		line = codeSpan.ReplaceAllString(line, "code")
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			t := m[1]
			if t == "" || scheme.MatchString(t) || strings.HasPrefix(t, "//") {
				continue
			}
			ls = append(ls, Link{Line: n, Target: t})
		}
	})
	return ls
}

// CheckLinks returns what is wrong with the relative links of files (paths relative
// to root): a target that does not exist, or an #anchor that the target markdown file
// (or the file itself, for "#anchor") does not have.
func CheckLinks(root string, files []string) []string {
	var problems []string
	anchors := map[string]map[string]bool{}
	anchorsOf := func(file string) (map[string]bool, error) {
		if a, ok := anchors[file]; ok {
			return a, nil
		}
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return nil, err
		}
		anchors[file] = Anchors(string(b))
		return anchors[file], nil
	}
	for _, file := range files {
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		for _, l := range Links(string(b)) {
			if p := checkLink(root, file, l.Target, anchorsOf); p != "" {
				problems = append(problems, fmt.Sprintf("%s:%d: link %s: %s", file, l.Line, l.Target, p))
			}
		}
	}
	return problems
}

// checkLink says what is wrong with the link target of file, or "".
func checkLink(root, file, target string, anchorsOf func(string) (map[string]bool, error)) string {
	p, frag, _ := strings.Cut(target, "#")
	p, err := url.PathUnescape(p)
	if err != nil {
		return err.Error()
	}
	dest := file
	switch {
	case p == "":
	case strings.HasPrefix(p, "/"):
		dest = path.Clean(strings.TrimPrefix(p, "/"))
	default:
		dest = path.Join(path.Dir(file), p)
	}
	if dest == ".." || strings.HasPrefix(dest, "../") {
		return "leaves the repository"
	}
	if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(dest))); err != nil {
		return fmt.Sprintf("%s does not exist", dest)
	}
	if frag == "" {
		return ""
	}
	if !strings.HasSuffix(dest, ".md") {
		return fmt.Sprintf("an anchor into %s, which is not markdown", dest)
	}
	as, err := anchorsOf(dest)
	if err != nil {
		return err.Error()
	}
	if !as[frag] {
		return fmt.Sprintf("%s has no heading with the anchor #%s", dest, frag)
	}
	return ""
}
