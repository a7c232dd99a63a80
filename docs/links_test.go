// Package docs holds the documentation beyond the README; its test checks
// every link of the project's Markdown.
package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	link    = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
)

// slug is GitHub's anchor for a heading.
func slug(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	h = regexp.MustCompile(`[^\w\- ]`).ReplaceAllString(h, "")
	return strings.ReplaceAll(h, " ", "-")
}

// anchors are the headings of a Markdown file, outside its code blocks.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	fence := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			fence = !fence
		}
		if m := heading.FindStringSubmatch(l); m != nil && !fence {
			out[slug(m[1])] = true
		}
	}
	return out
}

// Every relative link in the project's Markdown names a file that exists
// and, with #anchor, a heading it has.
func TestLinks(t *testing.T) {
	root := ".."
	texts := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".cache" || d.Name() == "node_modules" || d.Name() == ".git" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			texts[filepath.Clean(path)] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for path, text := range texts {
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			dest := path
			if file != "" {
				dest = filepath.Clean(filepath.Join(filepath.Dir(path), file))
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s: link to %s: no such file", path, target)
					continue
				}
			}
			checked++
			if anchor == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			if !anchors(texts[dest])[anchor] {
				t.Errorf("%s: link to %s: %s has no heading #%s", path, target, dest, anchor)
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d relative links checked: the walk missed the Markdown", checked)
	}
}
