package journal

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// metaInstance holds the journal's instance id.
var metaInstance = []byte("instance")

// instanceIDLen is the number of random bytes in an instance id.
const instanceIDLen = 16

// InstanceID is the identity of the sidecar that writes this journal: made
// at random when the journal is first opened for writing and kept in it, so
// a restart on the same journal is the same instance, and two running
// sidecars never share one (each holds its journal's lock). It is 32
// lowercase hex digits; "" for a read-only journal written before instance
// ids existed.
func (j *Journal) InstanceID() string { return j.instanceID }

// loadInstanceID reads the journal's instance id, first storing a new one if
// it has none (a new journal, or one written before instance ids existed).
func (j *Journal) loadInstanceID() error {
	err := j.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(metaInstance); v != nil {
			j.instanceID = string(v)
		}
		return nil
	})
	if err != nil || j.instanceID != "" || j.o.ReadOnly {
		return err
	}
	var b [instanceIDLen]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	id := hex.EncodeToString(b[:])
	err = j.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(metaInstance, []byte(id))
	})
	if err != nil {
		return fmt.Errorf("store instance id: %w", err)
	}
	j.instanceID = id
	return nil
}

// keepInstanceID makes id, an earlier file's instance id, this journal's:
// a journal repaired or reset is the same sidecar, and rejoins its Kafka
// groups as the same member. An id that is not one this package made is
// left out.
func (j *Journal) keepInstanceID(id string) error {
	if b, err := hex.DecodeString(id); err != nil || len(b) != instanceIDLen || id == j.instanceID {
		return nil
	}
	err := j.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(metaInstance, []byte(id))
	})
	if err != nil {
		return fmt.Errorf("keep instance id: %w", err)
	}
	j.instanceID = id
	return nil
}

// readInstanceID is the instance id stored in the journal file at path, or
// "" when it has none or cannot be read (a damaged file may panic bbolt).
func readInstanceID(path string) (id string) {
	defer func() {
		if recover() != nil {
			id = ""
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return ""
	}
	defer db.Close()
	_ = db.View(func(tx *bolt.Tx) error {
		if m := tx.Bucket(bucketMeta); m != nil {
			id = string(m.Get(metaInstance))
		}
		return nil
	})
	return id
}
