package handler

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// checkReadsLikeJSON fails unless readAnswer reads data as json.Unmarshal
// into a batchAnswer does: the same results, or an error for both.
func checkReadsLikeJSON(t testing.TB, data []byte) {
	t.Helper()
	got, err := readAnswer(data)
	var want batchAnswer
	wantErr := json.Unmarshal(data, &want)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("%q: readAnswer error %v, encoding/json error %v", data, err, wantErr)
	}
	if err == nil && !reflect.DeepEqual(got, want.Results) {
		t.Fatalf("%q:\nreadAnswer   %#v\nencoding/json %#v", data, got, want.Results)
	}
}

// answer64 is an app's answer to a batch of 64, as the bench's app writes it.
func answer64() []byte {
	var b strings.Builder
	b.WriteString(`{"results":[`)
	for i := range 64 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"%08x-8a3d-4c1e-9f0a-1b2c3d4e5f60","status":200}`, i)
	}
	b.WriteString("]}\n")
	return []byte(b.String())
}

var answerShapes = []struct {
	name  string
	data  string
	plain bool // read without encoding/json
}{
	{"usual", string(answer64()), true},
	{"every field", `{"results": [{"id": "a", "outcome": "retry", "status": 503, "retry_after": 5, "detail": "stock service down"}]}`, true},
	{"retry_after a date", `{"results": [{"id": "a", "outcome": "retry", "retry_after": "Wed, 21 Oct 2026 07:28:00 GMT"}]}`, true},
	{"retry_after a fraction", `{"results": [{"id": "a", "retry_after": 2.5}]}`, true},
	{"unknown fields", `{"results": [{"id": "a", "status": 200, "extra": [1, {"x": null}]}], "took_ms": 3}`, true},
	{"no results", `{"results": []}`, true},
	{"non-ASCII", `{"results": [{"id": "é日本🎉", "detail": "ünïcode"}]}`, true},
	{"negative status", `{"results": [{"id": "a", "status": -1}]}`, true},

	{"null answer", `null`, false},
	{"null results", `{"results": null}`, false},
	{"no results field", `{"other": 1}`, false},
	{"results twice", `{"results": [{"id": "a", "status": 500}], "results": [{"id": "b"}]}`, false},
	{"results in capitals", `{"Results": [{"ID": "a", "Status": 422}]}`, false},
	{"field in capitals", `{"results": [{"Id": "a"}]}`, false},
	{"long s folds to s", `{"results": [{"id": "a", "ſtatus": 500}]}`, false},
	{"field twice", `{"results": [{"id": "a", "id": "b"}]}`, false},
	{"null field", `{"results": [{"id": "a", "detail": null}]}`, false},
	{"null result", `{"results": [null, {"id": "b"}]}`, false},
	{"escaped id", `{"results": [{"id": "a\u0062\"c"}]}`, false},
	{"lone surrogate", `{"results": [{"id": "\ud800x"}]}`, false},
	{"invalid UTF-8", "{\"results\": [{\"id\": \"a\xffb\"}]}", false},
	{"status a fraction", `{"results": [{"id": "a", "status": 200.5}]}`, false},
	{"status an exponent", `{"results": [{"id": "a", "status": 2e2}]}`, false},
	{"status a string", `{"results": [{"id": "a", "status": "200"}]}`, false},
	{"status too large", `{"results": [{"id": "a", "status": 99999999999999999999}]}`, false},
	{"id a number", `{"results": [{"id": 7}]}`, false},
	{"retry_after an object", `{"results": [{"id": "a", "retry_after": {"s": 5}}]}`, false},
	{"results an object", `{"results": {"id": "a"}}`, false},
	{"an array", `[{"id": "a"}]`, false},
	{"empty", ``, false},
	{"cut short", `{"results": [{"id": "a"`, false},
	{"trailing garbage", `{"results": []} x`, false},
	{"NaN", `{"results": [{"id": "a", "status": NaN}]}`, false},
	{"control character", "{\"results\": [{\"id\": \"a\x01\"}]}", false},
	{"deep", `{"results": [], "x": ` + strings.Repeat("[", 400) + strings.Repeat("]", 400) + `}`, false},
	// Deeper than encoding/json goes: refused, not a stack overflow.
	{"deeper", `{"results": [], "x": ` + strings.Repeat("[", 1<<20), false},
}

// Answers of the usual shape are read without encoding/json; every other is
// left to it. Either way the results, or the failure, are encoding/json's.
func TestReadAnswerReadsAsEncodingJSON(t *testing.T) {
	for _, tt := range answerShapes {
		t.Run(tt.name, func(t *testing.T) {
			_, plain := readPlainAnswer([]byte(tt.data))
			if plain != tt.plain {
				t.Errorf("read without encoding/json: %v, want %v", plain, tt.plain)
			}
			checkReadsLikeJSON(t, []byte(tt.data))
		})
	}
}

func FuzzReadAnswer(f *testing.F) {
	for _, tt := range answerShapes {
		f.Add([]byte(tt.data))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkReadsLikeJSON(t, data) })
}

// BenchmarkReadAnswer reads an answer to a batch of 64: readAnswer against
// encoding/json, as SendBatch read it before.
func BenchmarkReadAnswer(b *testing.B) {
	data := answer64()
	b.Run("handoff", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if rs, err := readAnswer(data); err != nil || len(rs) != 64 {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var a batchAnswer
			if err := json.Unmarshal(data, &a); err != nil || len(a.Results) != 64 {
				b.Fatal(err)
			}
		}
	})
}
