package handler

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/valyala/fastjson"
)

// A batch's answer, {"results": [{"id": ..., "status": ...}, ...]}, is read
// as encoding/json reads it into batchAnswer, which is what the app's side
// of the contract is written against, but without its reflection: for 64
// results encoding/json took about 55-100 µs and 79 allocations, a few
// percent of all the sidecar does for a batch. An answer of the usual shape
// is read by a JSON parser without reflection; any other (a field named in
// another case, a name twice, a null, an escaped string, a status that is
// not a plain integer) is left to encoding/json, whose result on such input
// is not worth reproducing by hand. FuzzReadAnswer holds the two to the
// same results on any input.

// batchAnswer is the answer's shape, as encoding/json reads it.
type batchAnswer struct {
	Results []batchResult `json:"results"`
}

var answerParsers fastjson.ParserPool

// readAnswer reads the results of a batch's answer, or fails as
// json.Unmarshal into a batchAnswer does.
func readAnswer(data []byte) ([]batchResult, error) {
	if results, ok := readPlainAnswer(data); ok {
		return results, nil
	}
	var a batchAnswer
	if err := json.Unmarshal(data, &a); err != nil {
		return nil, err
	}
	return a.Results, nil
}

// readPlainAnswer reads an answer of the usual shape: ok false leaves any
// other, valid or not, to encoding/json.
func readPlainAnswer(data []byte) (results []batchResult, ok bool) {
	p := answerParsers.Get()
	defer answerParsers.Put(p)
	v, err := p.ParseBytes(data)
	if err != nil {
		return nil, false // not JSON, or nested deeper than the parser goes
	}
	// The parser takes some invalid JSON (a bare NaN, a raw control
	// character in a string) that encoding/json refuses. The check
	// recurses without a bound, so it comes once the parser has found the
	// nesting shallow.
	if fastjson.ValidateBytes(data) != nil {
		return nil, false
	}
	top, err := v.Object()
	if err != nil {
		return nil, false
	}
	var list *fastjson.Value
	ok = true
	top.Visit(func(key []byte, v *fastjson.Value) {
		switch {
		case string(key) == "results" && list == nil:
			list = v
		case bytes.EqualFold(key, resultsName):
			ok = false // twice, or in another case
		}
	})
	if !ok || list == nil {
		return nil, false
	}
	items, err := list.Array()
	if err != nil {
		return nil, false
	}
	results = make([]batchResult, len(items))
	var scratch []byte
	for i, item := range items {
		if !readPlainResult(item, &results[i], &scratch) {
			return nil, false
		}
	}
	return results, true
}

var resultsName = []byte("results")

// readPlainResult reads one result of the usual shape into r: each field
// at most once, spelled as the contract spells it, no nulls. scratch is
// room for a value's text, reused.
func readPlainResult(v *fastjson.Value, r *batchResult, scratch *[]byte) bool {
	o, err := v.Object()
	if err != nil {
		return false
	}
	var seen [len(resultFields)]bool
	ok := true
	o.Visit(func(key []byte, v *fastjson.Value) {
		if !ok {
			return
		}
		f := resultField(key)
		if f < 0 {
			if foldsToResultField(key) {
				ok = false // encoding/json matches a field name in any case
			}
			return
		}
		if seen[f] {
			ok = false
			return
		}
		seen[f] = true
		switch f {
		case fieldStatus:
			r.Status, ok = plainInt(v, scratch)
		case fieldRetryAfter:
			// As it was written, a number or a string: eventResult reads
			// it as before.
			r.RetryAfter, ok = plainRetryAfter(v, scratch)
			r.RetryAfter = bytes.Clone(r.RetryAfter)
		default:
			var s string
			if s, ok = plainString(v, scratch); ok {
				switch f {
				case fieldID:
					r.ID = s
				case fieldOutcome:
					r.Outcome = s
				case fieldDetail:
					r.Detail = s
				}
			}
		}
	})
	return ok
}

const (
	fieldID = iota
	fieldOutcome
	fieldStatus
	fieldRetryAfter
	fieldDetail
)

var resultFields = [...][]byte{
	fieldID: []byte("id"), fieldOutcome: []byte("outcome"), fieldStatus: []byte("status"),
	fieldRetryAfter: []byte("retry_after"), fieldDetail: []byte("detail"),
}

// resultField is the field key names exactly, or -1.
func resultField(key []byte) int {
	for i, name := range resultFields {
		if bytes.Equal(key, name) {
			return i
		}
	}
	return -1
}

// foldsToResultField reports whether key names a field in another case, as
// encoding/json matches it (bytes.EqualFold, "ſ" and "K" included).
func foldsToResultField(key []byte) bool {
	for _, name := range resultFields {
		if bytes.EqualFold(key, name) {
			return true
		}
	}
	return false
}

// plainString is a string value with nothing to unescape, in valid UTF-8:
// its bytes are its value, as encoding/json reads it.
func plainString(v *fastjson.Value, scratch *[]byte) (string, bool) {
	raw, ok := plainStringJSON(v, scratch)
	if !ok {
		return "", false
	}
	return string(raw[1 : len(raw)-1]), true
}

// plainStringJSON is the JSON text of a plain string value (see
// plainString), quotes included, in scratch.
func plainStringJSON(v *fastjson.Value, scratch *[]byte) ([]byte, bool) {
	// As written: the parser unescapes a string in place once its type is
	// asked for, and writes it escaped again after.
	raw := v.MarshalTo((*scratch)[:0])
	*scratch = raw
	if len(raw) < 2 || raw[0] != '"' {
		return nil, false
	}
	// No raw control characters: the answer was checked as JSON.
	if bytes.IndexByte(raw, '\\') >= 0 || !utf8.Valid(raw) {
		return nil, false // encoding/json puts U+FFFD for each bad byte
	}
	return raw, true
}

// plainInt is a number value that encoding/json reads into an int: digits,
// with a minus sign at most, that fit.
func plainInt(v *fastjson.Value, scratch *[]byte) (int, bool) {
	if v.Type() != fastjson.TypeNumber {
		return 0, false
	}
	*scratch = v.MarshalTo((*scratch)[:0])
	n, err := strconv.ParseInt(string(*scratch), 10, 64)
	if err != nil {
		return 0, false
	}
	return int(n), true
}

// plainRetryAfter is a retry_after value as written, in scratch, when it is
// a number or a plain string.
func plainRetryAfter(v *fastjson.Value, scratch *[]byte) (json.RawMessage, bool) {
	if raw, ok := plainStringJSON(v, scratch); ok {
		return raw, true
	}
	if v.Type() != fastjson.TypeNumber {
		return nil, false
	}
	*scratch = v.MarshalTo((*scratch)[:0])
	return *scratch, true
}
