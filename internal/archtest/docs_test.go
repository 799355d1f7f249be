package archtest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// mdRef matches a reference to a Markdown document: a link target or a
// bare path such as docs/operations.md.
var mdRef = regexp.MustCompile(`[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md\b`)

// TestReferencedDocumentsExist: every .md document that a document, a Go
// file or the CI script names exists, relative to the file that names it or
// to the repository root.
func TestReferencedDocumentsExist(t *testing.T) {
	t.Parallel()
	root := "../.."
	var files []string
	require.NoError(t, filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bin", "tools", "node_modules", "tmp":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".md") || strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".yml") {
			files = append(files, path)
		}
		return nil
	}))
	require.NotEmpty(t, files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, ref := range mdRef.FindAllString(string(b), -1) {
			if strings.Contains(ref, "://") || strings.HasPrefix(ref, "github.com") {
				continue
			}
			ref = strings.TrimPrefix(ref, "./")
			candidates := []string{filepath.Join(filepath.Dir(f), ref), filepath.Join(root, ref)}
			found := false
			for _, c := range candidates {
				if _, err := os.Stat(c); err == nil {
					found = true
					break
				}
			}
			require.True(t, found, "%s refers to %s, which is not in the repository", f, ref)
		}
	}
}
