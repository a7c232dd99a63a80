package deadletter

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
)

// ID is a dead letter's position in its DLQ, which is its identity: the
// same on every replica, and never reused while the log lives.
type ID struct {
	// Log is the DLQ's name: Q.dlq (RabbitMQ stream) or T.G.dlq (Kafka topic).
	Log string
	// Partition is the Kafka partition, NoPartition on a RabbitMQ stream.
	Partition int32
	Offset    int64
}

// NoPartition is the Partition of a position in a log that has none.
const NoPartition int32 = -1

// String is Q.dlq/<offset> or T.G.dlq/<partition>/<offset>.
func (id ID) String() string {
	if id.Partition == NoPartition {
		return id.Log + "/" + strconv.FormatInt(id.Offset, 10)
	}
	return id.Log + "/" + strconv.FormatInt(int64(id.Partition), 10) + "/" + strconv.FormatInt(id.Offset, 10)
}

// ParseID reads what ID.String wrote. A DLQ's name ends in ".dlq", which
// tells the two forms apart even when a RabbitMQ queue name holds a slash.
func ParseID(s string) (ID, error) {
	rest, off, ok := cutLastNumber(s)
	if !ok {
		return ID{}, fmt.Errorf("%w: %q", ErrBadID, s)
	}
	if strings.HasSuffix(rest, ".dlq") {
		return ID{Log: rest, Partition: NoPartition, Offset: off}, nil
	}
	log, p, ok := cutLastNumber(rest)
	if !ok || !strings.HasSuffix(log, ".dlq") || p > 1<<31-1 {
		return ID{}, fmt.Errorf("%w: %q", ErrBadID, s)
	}
	return ID{Log: log, Partition: int32(p), Offset: off}, nil
}

// cutLastNumber splits "a/b/12" into "a/b", 12.
func cutLastNumber(s string) (string, int64, bool) {
	i := strings.LastIndexByte(s, '/')
	if i <= 0 || i == len(s)-1 {
		return "", 0, false
	}
	num := s[i+1:]
	if num[0] == '+' || num[0] == '-' || (len(num) > 1 && num[0] == '0') {
		return "", 0, false // one spelling per id
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return "", 0, false
	}
	return s[:i], n, true
}

// key is id as an index key: log, a zero byte, then partition and offset
// big-endian, so that a log's dead letters sort by position and one
// partition's form one range. The partition is stored plus one, so that
// NoPartition sorts first and every key has the same shape.
func (id ID) key() []byte {
	k := make([]byte, 0, len(id.Log)+1+4+8)
	k = append(k, id.Log...)
	k = append(k, 0)
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(k, uint32(id.Partition+1)), uint64(id.Offset))
}

// partitionPrefix is the key prefix of a log's partition.
func partitionPrefix(log string, p int32) []byte {
	k := append([]byte(log), 0)
	return binary.BigEndian.AppendUint32(k, uint32(p+1))
}

// idFromKey reads what key wrote.
func idFromKey(k []byte) (ID, bool) {
	if len(k) < 13 || k[len(k)-13] != 0 {
		return ID{}, false
	}
	n := len(k) - 12
	return ID{
		Log:       string(k[:n-1]),
		Partition: int32(binary.BigEndian.Uint32(k[n:])) - 1,
		Offset:    int64(binary.BigEndian.Uint64(k[n+4:])),
	}, true
}
