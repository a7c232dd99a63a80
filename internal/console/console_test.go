package console

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Every file is served with the strict policy and no framing; the page
// names its script and stylesheet as files (no inline script or style,
// which the policy would refuse), and the prefix without its slash
// redirects to it.
func TestHandlerServesTheFilesUnderPolicy(t *testing.T) {
	h := Handler()
	for _, tt := range []struct{ path, typ, holds string }{
		{"/ui/", "text/html", `<script src="app.js" defer></script>`},
		{"/ui/app.js", "text/javascript", "'use strict';"},
		{"/ui/style.css", "text/css", ":root"},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", tt.path, nil))
		if rec.Code != 200 || !strings.HasPrefix(rec.Header().Get("Content-Type"), tt.typ) || !strings.Contains(rec.Body.String(), tt.holds) {
			t.Fatalf("GET %s: %d %q", tt.path, rec.Code, rec.Header().Get("Content-Type"))
		}
		for k, want := range map[string]string{"Content-Security-Policy": CSP, "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff"} {
			if got := rec.Header().Get(k); got != want {
				t.Errorf("GET %s: %s %q, want %q", tt.path, k, got, want)
			}
		}
	}
	for _, bad := range []string{"script-src 'self';", "frame-ancestors 'none'", "connect-src 'self'"} {
		if !strings.Contains(CSP, bad) {
			t.Errorf("the policy lacks %q", bad)
		}
	}
	if strings.Contains(CSP, "unsafe-inline") || strings.Contains(CSP, "unsafe-eval") {
		t.Errorf("the policy allows inline code: %s", CSP)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/ui", nil))
	if rec.Code != http.StatusMovedPermanently || rec.Header().Get("Location") != "/ui/" {
		t.Fatalf("GET /ui: %d %q", rec.Code, rec.Header().Get("Location"))
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/ui/missing.js", nil))
	if rec.Code != 404 {
		t.Fatalf("GET a file that is not there: %d", rec.Code)
	}
	// No inline script or style in the page: the policy would refuse it.
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/ui/", nil))
	page := rec.Body.String()
	if strings.Contains(page, "<script>") || strings.Contains(page, "<style") || strings.Contains(page, " style=") || strings.Contains(page, " onclick=") {
		t.Fatal("the page holds inline script or style")
	}
}
