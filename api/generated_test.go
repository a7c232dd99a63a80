package api

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// sumFile records, as `make proto` left them, the digests of the contracts
// and of the code generated from them.
const sumFile = "generated.sum"

// contract reports whether path is an input of, or made by, make proto.
func contract(path string) bool {
	if strings.HasPrefix(filepath.Base(path), "buf.") {
		return true
	}
	for _, ext := range []string{".proto", ".yaml", ".pb.go", ".pb.gw.go", ".swagger.json"} {
		if strings.HasSuffix(path, ext) {
			return true
		}
	}
	return false
}

// digests lists "sha256  path" for every contract file under the api
// directory, in path order: what `sha256sum` prints, so make proto writes it.
func digests(t *testing.T) string {
	t.Helper()
	var paths []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && contract(p) {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(paths)
	var b strings.Builder
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		b.WriteString(hex.EncodeToString(sum[:]) + "  " + filepath.ToSlash(p) + "\n")
	}
	return b.String()
}

// The generated code is what make proto makes of the contracts as they are:
// a contract changed without regenerating, or generated code edited by
// hand, fails here. `make proto` fixes it.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	want, err := os.ReadFile(sumFile)
	if err != nil {
		t.Fatalf("%s: %v (make proto writes it)", sumFile, err)
	}
	if got := digests(t); got != string(want) {
		t.Errorf("the contracts or their generated code changed since make proto ran; run make proto and commit the result.\n%s now:\n%s\nrecorded:\n%s", sumFile, got, want)
	}
}
