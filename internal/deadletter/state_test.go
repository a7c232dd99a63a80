package deadletter

import (
	"errors"
	"testing"
)

func TestDecideEveryPair(t *testing.T) {
	// want[from][transition] is the state after; a pair not listed is illegal.
	want := map[State]map[Transition]State{
		Pending:   {Approve: Approved, Terminate: Terminated, Expire: Expired},
		Approved:  {Approve: Approved, Replay: Replaying, Complete: Done, FailReplay: FailedReplay, Terminate: Terminated, Expire: Expired},
		Replaying: {Complete: Done, FailReplay: FailedReplay, Terminate: Terminated, Expire: Expired},
	}
	for _, from := range append(States, State("bogus")) {
		for _, tr := range append(Transitions, Transition("bogus")) {
			t.Run(string(from)+"/"+string(tr), func(t *testing.T) {
				to, err := Decide(from, tr)
				exp, ok := want[from][tr]
				if !ok {
					var ie *IllegalError
					if !errors.As(err, &ie) || !errors.Is(err, ErrIllegal) {
						t.Fatalf("Decide(%s, %s) = %s, %v; want an IllegalError", from, tr, to, err)
					}
					if ie.From != from || ie.Transition != tr || to != from {
						t.Fatalf("Decide(%s, %s) = %s, %+v", from, tr, to, ie)
					}
					if ie.Error() == "" {
						t.Fatal("empty message")
					}
					return
				}
				if err != nil || to != exp {
					t.Fatalf("Decide(%s, %s) = %s, %v; want %s", from, tr, to, err, exp)
				}
			})
		}
	}
}

func TestClosedStatesHaveNoWayOut(t *testing.T) {
	for _, s := range States {
		for _, tr := range Transitions {
			if _, err := Decide(s, tr); s.Closed() && err == nil {
				t.Errorf("%s is closed but %s leaves it", s, tr)
			}
		}
		if !s.Valid() {
			t.Errorf("%s not valid", s)
		}
	}
	if State("x").Valid() || Transition("x").Valid() {
		t.Error("unknown values are valid")
	}
}
