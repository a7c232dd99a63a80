package adminv1

import (
	"encoding/json"
	"testing"
)

// The document says how to authenticate: a client generated from it sends
// the admin token as a bearer token on every call.
func TestOpenAPISaysBearer(t *testing.T) {
	var doc struct {
		SecurityDefinitions map[string]struct {
			Type, Name, In string
		} `json:"securityDefinitions"`
		Security []map[string][]string `json:"security"`
		Paths    map[string]map[string]struct {
			Security *[]map[string][]string `json:"security"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	b, ok := doc.SecurityDefinitions["bearer"]
	if !ok || b.Type != "apiKey" || b.In != "header" || b.Name != "Authorization" {
		t.Fatalf("securityDefinitions = %+v, want bearer: an apiKey in the Authorization header", doc.SecurityDefinitions)
	}
	if len(doc.Security) != 1 || doc.Security[0]["bearer"] == nil {
		t.Errorf("security = %v, want bearer required for every operation", doc.Security)
	}
	if len(doc.Paths) == 0 {
		t.Fatal("no paths")
	}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			if op.Security != nil {
				t.Errorf("%s %s overrides the bearer requirement: %v", method, path, *op.Security)
			}
		}
	}
}
