package codeshape

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// generatedDirs hold only generated code (make proto); proto-check compares them whole,
// so no doc.go can live there.
var generatedDirs = map[string]bool{"proto/allocd/v1": true}

// undocumented are exported names without their sentence: none. A name may stand here
// only while the branch that writes its sentence is open.
var undocumented = map[string]bool{}

// goFiles calls fn for every Go file of the module, module-relative, skipping hidden
// folders, testdata and the folders of other modules (a go.mod of their own).
func goFiles(t *testing.T, fn func(rel, path string)) {
	t.Helper()
	root := filepath.Join("..", "..", "..")
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() && path != root {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		n++
		fn(filepath.ToSlash(rel), path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 100 {
		t.Fatalf("walked %d Go files; the walk did not find the module's code", n)
	}
}

// TestDocGo: every package has a doc.go whose comment says what it owns ("Package x
// ...", "Command x ..."), as docs/contributors/development.md says.
func TestDocGo(t *testing.T) {
	dirs := map[string]bool{}
	goFiles(t, func(rel, _ string) {
		if dir := filepath.ToSlash(filepath.Dir(rel)); !strings.HasSuffix(rel, "_test.go") &&
			!generatedDirs[dir] {
			dirs[dir] = true
		}
	})
	fset := token.NewFileSet()
	for dir := range dirs {
		path := filepath.Join("..", "..", "..", dir, "doc.go")
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%s has no doc.go", dir)
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		want := "Package " + f.Name.Name + " "
		if f.Name.Name == "main" {
			want = "Command " + filepath.Base(dir) + " "
		}
		if f.Doc == nil || !strings.HasPrefix(f.Doc.Text(), want) {
			t.Errorf("%s/doc.go: the package comment does not start with %q", dir, want)
		}
	}
}

// TestDocComments: every exported name of a non-main package (top-level, and the
// methods of exported types) has a comment with a sentence that starts with its name
// (docs/contributors/development.md). A group comment counts for a lone spec only.
func TestDocComments(t *testing.T) {
	fset := token.NewFileSet()
	goFiles(t, func(rel, path string) {
		if strings.HasSuffix(rel, "_test.go") || strings.HasSuffix(rel, ".pb.go") {
			return
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if f.Name.Name == "main" {
			return
		}
		for _, name := range undocumentedNames(f) {
			if !undocumented[rel+":"+name] {
				t.Errorf("%s: %s has no comment sentence that starts with its name", rel, name)
			}
		}
	})
}

// undocumentedNames returns the exported names of f without their sentence.
func undocumentedNames(f *ast.File) []string {
	var out []string
	check := func(name string, docs ...*ast.CommentGroup) {
		for _, d := range docs {
			if d != nil && startsSentence(d.Text(), name) {
				return
			}
		}
		out = append(out, name)
	}
	for _, dcl := range f.Decls {
		switch d := dcl.(type) {
		case *ast.FuncDecl:
			if d.Name.IsExported() && (d.Recv == nil || exportedRecv(d.Recv)) {
				check(d.Name.Name, d.Doc)
			}
		case *ast.GenDecl:
			var group *ast.CommentGroup
			if len(d.Specs) == 1 {
				group = d.Doc
			}
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						check(s.Name.Name, s.Doc, group)
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() {
							check(n.Name, s.Doc, s.Comment, group)
						}
					}
				}
			}
		}
	}
	return out
}

// startsSentence reports whether a sentence of text starts with name (or with "A",
// "An" or "The" and name).
func startsSentence(text, name string) bool {
	re := regexp.MustCompile(`(^|[.:;]\s+|\n\n)((A|An|The) )?` + regexp.QuoteMeta(name) + `\b`)
	return re.MatchString(text)
}

// exportedRecv reports whether a method's receiver type is exported.
func exportedRecv(recv *ast.FieldList) bool {
	t := recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	id, ok := t.(*ast.Ident)
	return ok && id.IsExported()
}
