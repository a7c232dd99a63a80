package broker

// Ordering is how a Kafka source hands a partition's records over: in
// parallel, one key at a time, or one record at a time.
type Ordering string

const (
	// OrderNone hands records over in parallel within a partition; a
	// failed one moves to the retry topics, and the rest go on.
	OrderNone Ordering = "none"
	// OrderKey hands the records of one key over one at a time, in offset
	// order; other keys go on in parallel.
	OrderKey Ordering = "key"
	// OrderPartition hands a partition's records over one at a time.
	OrderPartition Ordering = "partition"
)

// Valid reports whether o is one of the orderings (the empty value is
// not: config fills in OrderNone).
func (o Ordering) Valid() bool {
	switch o {
	case OrderNone, OrderKey, OrderPartition:
		return true
	}
	return false
}

// InPlace reports whether a failed record is retried where it is, holding
// back what follows it in its key or partition, rather than moved to a
// retry topic: the ordered modes, which have no retry topics.
func (o Ordering) InPlace() bool { return o == OrderKey || o == OrderPartition }
