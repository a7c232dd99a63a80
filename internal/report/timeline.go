package report

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/journal"
)

const stampLayout = "2006-01-02T15:04:05.000Z07:00"

func Timeline(w io.Writer, k journal.Key, steps []journal.Step) {
	fmt.Fprintln(w, k)
	for _, s := range steps {
		fmt.Fprintf(w, "  %s  %s\n", s.At.UTC().Format(stampLayout), s.Text())
	}
}

func TimelineJSON(w io.Writer, k journal.Key, steps []journal.Step) error {
	out := struct {
		Source   string     `json:"source"`
		EventID  string     `json:"event_id"`
		ReplayID string     `json:"replay_id,omitempty"`
		Steps    []stepJSON `json:"steps"`
	}{Source: k.Source, EventID: k.EventID, ReplayID: k.ReplayID}
	for _, s := range steps {
		j := stepJSON{At: s.At.UTC(), Kind: s.Kind.String(), Hop: s.Hop, Attempt: s.Attempt, Status: s.Status,
			Dest: s.Dest, Detail: s.Detail, Trail: s.Trail}
		if s.Kind == journal.Outcome {
			j.Outcome = budget.Outcome(s.Outcome).String()
			j.Latency = s.Latency.String()
		}
		out.Steps = append(out.Steps, j)
	}
	return json.NewEncoder(w).Encode(out)
}

type stepJSON struct {
	At      time.Time         `json:"at"`
	Kind    string            `json:"kind"`
	Hop     int               `json:"hop"`
	Attempt int               `json:"attempt,omitempty"`
	Outcome string            `json:"outcome,omitempty"`
	Status  int               `json:"status,omitempty"`
	Latency string            `json:"latency,omitempty"`
	Dest    string            `json:"dest,omitempty"`
	Detail  string            `json:"detail,omitempty"`
	Trail   map[string]string `json:"trail,omitempty"`
}
