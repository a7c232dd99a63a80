package journal

import (
	"encoding/hex"
	"errors"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// The instance id is made once per journal file: every later open, for
// writing or only for reading, returns it, and another file has its own.
func TestInstanceIDIsKeptInTheJournal(t *testing.T) {
	path := newPath(t)
	j, _ := openJournal(t, path, Options{})
	id := j.InstanceID()
	if b, err := hex.DecodeString(id); err != nil || len(b) != instanceIDLen {
		t.Fatalf("instance id %q: want %d random bytes in hex", id, instanceIDLen)
	}

	// A second process cannot open the file while this one holds it, so it
	// cannot take the same id.
	if _, _, err := Open(path, testOptions(Options{})); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open of a journal in use: %v, want ErrLocked", err)
	}

	j, _ = reopen(t, j, Options{})
	if got := j.InstanceID(); got != id {
		t.Errorf("after reopen: instance id %q, want %q", got, id)
	}
	j, _ = reopen(t, j, Options{ReadOnly: true})
	if got := j.InstanceID(); got != id {
		t.Errorf("read-only: instance id %q, want %q", got, id)
	}

	other, _ := openJournal(t, newPath(t), Options{})
	if other.InstanceID() == id {
		t.Errorf("two journals share the instance id %q", id)
	}
}

// A journal written before instance ids existed gets one when a sidecar
// opens it, and keeps it; a read-only look at it neither makes nor stores one.
func TestInstanceIDAddedToAnOlderJournal(t *testing.T) {
	path := newPath(t)
	j, _ := openJournal(t, path, Options{})
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	removeInstanceID(t, path)

	ro, _ := openJournal(t, path, Options{ReadOnly: true})
	if got := ro.InstanceID(); got != "" {
		t.Errorf("read-only open of a journal without an id: %q, want none", got)
	}
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}

	j, _ = openJournal(t, path, Options{})
	id := j.InstanceID()
	if id == "" {
		t.Fatal("no instance id made for a journal that had none")
	}
	j, _ = reopen(t, j, Options{})
	if got := j.InstanceID(); got != id {
		t.Errorf("after reopen: instance id %q, want %q", got, id)
	}
}

// removeInstanceID makes path look like a journal written before instance
// ids existed.
func removeInstanceID(t *testing.T, path string) {
	t.Helper()
	updateFile(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(metaInstance) })
}

// A journal repaired or reset is the same sidecar: the new file keeps the
// old one's instance id.
func TestInstanceIDKeptByRepairAndReset(t *testing.T) {
	tests := []struct {
		name string
		redo func(path string) error
	}{
		{"repair", func(path string) error { _, err := Repair(path); return err }},
		{"reset", func(path string) error { _, err := Reset(path); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := newPath(t)
			j, _ := openJournal(t, path, Options{})
			id := j.InstanceID()
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			if err := tt.redo(path); err != nil {
				t.Fatal(err)
			}
			j, _ = openJournal(t, path, Options{})
			if got := j.InstanceID(); got != id {
				t.Errorf("instance id after %s: %q, want %q", tt.name, got, id)
			}
		})
	}
}
