package admin

import (
	"encoding/json"
	"testing"
	"time"

	"handoff.dev/handoff/internal/telemetry"
)

// GET /v1/activity answers the history's steps by source, oldest first,
// with the step's length; it needs the token, as every call but the status.
func TestActivity(t *testing.T) {
	m, err := telemetry.NewMetrics(telemetry.MetricsOptions{Off: true})
	if err != nil {
		t.Fatal(err)
	}
	clock := t0
	h := telemetry.NewHistory(m, []string{"orders", "billing"}, 5*time.Second, time.Minute, func() time.Time { return clock })
	for i := range 3 {
		for range i + 1 {
			m.Attempted("orders", "success", true, time.Millisecond)
		}
		m.DeadLettered("orders", "permanent")
		clock = clock.Add(5 * time.Second)
		h.Record()
	}
	addr := serveOptions(t, Options{Token: []byte(dlToken), AllowAnonymousRead: true, Activity: h})
	if code, _ := restCall(t, addr, "GET", "/v1/activity", "", ""); code != 401 {
		t.Fatalf("anonymous read of the activity: %d", code)
	}
	code, out := restCall(t, addr, "GET", "/v1/activity", "", "Bearer "+dlToken)
	if code != 200 {
		t.Fatalf("%d %s", code, out)
	}
	var got struct {
		Step    string `json:"step"`
		Sources []struct {
			Name  string `json:"name"`
			Steps []struct {
				At           time.Time `json:"at"`
				Handled      string    `json:"handled"`
				DeadLettered string    `json:"deadLettered"`
			} `json:"steps"`
		} `json:"sources"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if got.Step != "5s" || len(got.Sources) != 2 || got.Sources[0].Name != "orders" || len(got.Sources[0].Steps) != 3 {
		t.Fatalf("activity %s", out)
	}
	last := got.Sources[0].Steps[2]
	if last.Handled != "3" || last.DeadLettered != "1" || !last.At.Equal(clock) {
		t.Fatalf("last step %+v in %s", last, out)
	}
	if len(got.Sources[1].Steps) != 3 || got.Sources[1].Steps[0].Handled != "0" {
		t.Fatalf("billing's steps in %s", out)
	}
}
