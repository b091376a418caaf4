// Package codeshape holds no code: its test checks the shape of the repository's Go
// code that the tools do not (no function over 80 lines outside tests).
package codeshape
