// Package shape measures the code's shape: the longest functions and the
// types with the most methods in the core packages, so the limits the
// design sets (functions under ~80 lines, types under ~30 methods) stay
// true as the code changes (see shape_test.go).
package shape

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Func is one function or method and its length in lines.
type Func struct {
	Name  string // pkg.Func or pkg.Type.Method
	Lines int
}

// Type is one named type and its method count.
type Type struct {
	Name    string // pkg.Type
	Methods int
}

// Measure parses the non-test Go files of the package directory dir.
func Measure(dir string) ([]Func, []Type, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	fset := token.NewFileSet()
	pkg := filepath.Base(dir)
	var funcs []Func
	methods := map[string]int{}
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, nil, err
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			name := pkg + "." + fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) == 1 {
				recv := recvName(fd.Recv.List[0].Type)
				name = pkg + "." + recv + "." + fd.Name.Name
				methods[pkg+"."+recv]++
			}
			lines := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			funcs = append(funcs, Func{name, lines})
		}
	}
	var types []Type
	for n, c := range methods {
		types = append(types, Type{n, c})
	}
	sort.Slice(funcs, func(i, j int) bool { return funcs[i].Lines > funcs[j].Lines })
	sort.Slice(types, func(i, j int) bool { return types[i].Methods > types[j].Methods })
	return funcs, types, nil
}

func recvName(e ast.Expr) string {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.Ident:
			return t.Name
		default:
			return "?"
		}
	}
}
