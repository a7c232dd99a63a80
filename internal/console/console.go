// Package console is the operator console: one page, served by the admin
// listener at /ui/, that reads and acts through the admin API's REST calls
// with the admin token. Its files are embedded in the binary, so every
// sidecar (and sidecar dev) has it without a network.
//
// The files hold no state of the sidecar: they are served without the
// token. Everything the page shows comes from /v1 calls, which need it.
// The page asks for the token once and keeps it in the tab's
// sessionStorage, gone when the tab closes.
//
// Every answer carries a strict Content-Security-Policy: scripts and
// styles from these files only (no inline script or style), calls to this
// origin only, and no framing.
package console

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed assets
var assets embed.FS

// Prefix is the path the console is served under.
const Prefix = "/ui/"

// CSP is the Content-Security-Policy of every answer.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

// Handler serves the console's files under Prefix, and redirects the
// prefix without its slash to it.
func Handler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix(Prefix, http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		// Checked again on each load: a new binary's files replace the old.
		h.Set("Cache-Control", "no-cache")
		if r.URL.Path == Prefix[:len(Prefix)-1] {
			http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
			return
		}
		files.ServeHTTP(w, r)
	})
}
