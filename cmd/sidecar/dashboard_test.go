package main

import (
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// dashboardFile is the Grafana dashboard built on the sidecar's metrics.
const dashboardFile = "../../deploy/grafana/handoff.json"

// dashboard is the part of a Grafana dashboard model the tests read.
type dashboard struct {
	SchemaVersion int                           `json:"schemaVersion"`
	Panels        []dashPanel                   `json:"panels"`
	Templating    struct{ List []dashVariable } `json:"templating"`
}

type dashPanel struct {
	ID          int                `json:"id"`
	Type        string             `json:"type"`
	Title       string             `json:"title"`
	Description string             `json:"description"`
	Datasource  *dashSource        `json:"datasource"`
	Targets     []dashTarget       `json:"targets"`
	GridPos     struct{ X, W int } `json:"gridPos"`
	// Panels are a collapsed row's panels.
	Panels []dashPanel `json:"panels"`
}

type dashSource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type dashTarget struct {
	RefID      string      `json:"refId"`
	Expr       string      `json:"expr"`
	Datasource *dashSource `json:"datasource"`
}

type dashVariable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"` // a string, or the Prometheus editor's {"query": ...}
	Datasource *dashSource     `json:"datasource"`
}

// query is the variable's query text, whichever form it is stored in.
func (v dashVariable) query() string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var q struct{ Query string }
	_ = json.Unmarshal(v.Query, &q)
	return q.Query
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// allPanels is every panel, a collapsed row's included.
func (d dashboard) allPanels() []dashPanel {
	var out []dashPanel
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// dashMetric finds the sidecar's metric names in a query: each starts
// handoff_, and no label or value the dashboard matches on does.
var dashMetric = regexp.MustCompile(`\bhandoff_[a-zA-Z0-9_]*`)

// queries is every query the dashboard sends, with where it is.
func (d dashboard) queries() map[string]string {
	out := map[string]string{}
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			out[p.Title+" / "+tg.RefID] = tg.Expr
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			out["variable "+v.Name] = v.query()
		}
	}
	return out
}

// dashFamily is the metric family a name in a query reads: a histogram's
// _bucket, _sum and _count series belong to the histogram.
func dashFamily(fams map[string]*dto.MetricFamily, name string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		if f, found := fams[base]; found && (f.GetType() == dto.MetricType_HISTOGRAM ||
			(suffix != "_bucket" && f.GetType() == dto.MetricType_SUMMARY)) {
			return base
		}
	}
	return name
}

// The dashboard is well formed for Grafana: unique panel ids, every panel
// titled, every query on the dashboard's Prometheus variable, and the
// source variable filled from a metric.
func TestDashboardPanels(t *testing.T) {
	d := readDashboard(t)
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: want one that Grafana 9+ imports as is", d.SchemaVersion)
	}
	ids := map[int]string{}
	for _, p := range d.allPanels() {
		if p.Title == "" {
			t.Errorf("panel %d (%s) has no title", p.ID, p.Type)
		}
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panel id %d is used by %q and %q", p.ID, other, p.Title)
		}
		ids[p.ID] = p.Title
		if p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q ends at column %d, past the grid's 24", p.Title, p.GridPos.X+p.GridPos.W)
		}
		if p.Type == "row" {
			continue // a row queries nothing
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q datasource %+v, want the ${datasource} variable", p.Title, p.Datasource)
		}
		if p.Description == "" {
			t.Errorf("panel %q has no description: say what to act on", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q query %s is empty", p.Title, tg.RefID)
			}
			if refs[tg.RefID] {
				t.Errorf("panel %q has two queries %s", p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			if tg.Datasource != nil && tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q query %s datasource %+v, want ${datasource}", p.Title, tg.RefID, tg.Datasource)
			}
		}
	}
	vars := map[string]dashVariable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v := vars["datasource"]; v.Type != "datasource" || string(v.Query) != `"prometheus"` {
		t.Errorf("variable datasource = %+v, want a Prometheus datasource variable", v)
	}
	if v := vars["source"]; v.query() != "label_values(handoff_messages_received_total, source)" ||
		v.Datasource == nil || v.Datasource.UID != "${datasource}" {
		t.Errorf("variable source: query %q on %+v, want label_values(handoff_messages_received_total, source) on ${datasource}",
			v.query(), v.Datasource)
	}
}

// Every metric the dashboard queries is one a running sidecar exports: a
// renamed or removed metric leaves a panel empty in Grafana, without an
// error, so it is caught here. The sidecar runs on kfake and handles one
// message of each kind, so that every counter has a sample.
func TestDashboardMetricsAreExported(t *testing.T) {
	t.Parallel()
	d := readDashboard(t)
	used := map[string][]string{} // metric → where the dashboard queries it
	for where, q := range d.queries() {
		for _, name := range dashMetric.FindAllString(q, -1) {
			used[name] = append(used[name], where)
		}
	}
	if len(used) == 0 {
		t.Fatal("the dashboard queries no handoff_ metric")
	}

	const topic = "dashboard"
	brokers := kafkaCluster(t, topic, 1)
	a := newApp(t, metricsScript)
	cfg := kafkaConfig(a.url(), brokers, topic, tier)
	cfg.Telemetry.DrainWindow = config.Duration(1200 * time.Millisecond) // a reading every 100ms
	s := startSidecar(t, cfg)
	var recs []*kgo.Record
	for _, id := range []string{"ok-1", "flaky-1", "bad-1"} {
		recs = append(recs, &kgo.Record{Topic: topic, Value: []byte(id), Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}}})
	}
	produceKafka(t, brokers, recs...)
	// Not the open dead letters: their gauges are there from the start, and
	// the index they are read from catches up on its own schedule.
	testkit.Eventually(t, 60*time.Second, "the handled, retried and dead-lettered messages, and a backlog estimate", func() bool {
		f := scrape(t, s.health)
		return sample(f, "handoff_outcomes_total", map[string]string{"outcome": "success"}) == 2 &&
			sample(f, "handoff_deadletters_total", nil) == 1 &&
			sample(f, "handoff_backlog_drain_seconds", nil) >= 0
	})
	// The retry copy delivered a second time, as a producer's retry would:
	// the journal settles it without calling the app.
	retried := readTopic(t, brokers, kafka.RetryTopic(topic, kafkaGroup(topic), tier))
	if len(retried) != 1 {
		t.Fatalf("retry tier holds %d copies, want 1", len(retried))
	}
	r := retried[0]
	produceKafka(t, brokers, &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers})
	testkit.Eventually(t, 10*time.Second, "the second copy settled as a duplicate", func() bool {
		return sample(scrape(t, s.health), "handoff_journal_duplicates_suppressed_total", nil) == 1
	})

	fams := scrape(t, s.health)
	checked := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(used)) {
		f := dashFamily(fams, name)
		checked[f] = true
		if _, ok := fams[f]; !ok {
			where := used[name]
			slices.Sort(where)
			t.Errorf("the dashboard queries %s, which the sidecar does not export (in %s)", name, strings.Join(where, "; "))
		}
	}
	if n := len(a.callsFor("flaky-1")); n != 2 {
		t.Errorf("app called %d times for flaky-1, want 2: the duplicate reached it", n)
	}
	t.Logf("the dashboard queries %d metric families (%d names); /metrics exports %d", len(checked), len(used), len(fams))
}
