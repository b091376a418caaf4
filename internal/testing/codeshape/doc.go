// Package codeshape holds no code: its tests check the shape of the repository that
// the compiler and the linters do not: the floors of the house (which package may
// import which: TestLayout), no build output or etcd data in git, no function over 80
// lines outside tests, a doc.go for every package and a sentence for every exported
// name (TestDocGo, TestDocComments), no line wider than 110 columns (TestLineWidth).
package codeshape
