package journal

import (
	"context"
	"path/filepath"
	"testing"
)

func TestMarksAreDurableAndNeverMoveBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	j, _, err := Open(path, testOptions(Options{}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, ok, err := j.Mark("a"); ok || err != nil {
		t.Fatalf("Mark of a new journal = %v, %v", ok, err)
	}
	if err := j.SetMarks(ctx, map[string]int64{"a": 7, "b": 0}); err != nil {
		t.Fatal(err)
	}
	if err := j.SetMarks(ctx, map[string]int64{"a": 3}); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	j, _ = openJournal(t, path, Options{})
	for name, want := range map[string]int64{"a": 7, "b": 0} {
		if v, ok, err := j.Mark(name); !ok || err != nil || v != want {
			t.Errorf("Mark(%s) after reopening = %d, %v, %v; want %d", name, v, ok, err, want)
		}
	}
}
