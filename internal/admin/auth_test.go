package admin

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/testkit"
)

func TestAllow(t *testing.T) {
	const tok = "the-token"
	tests := []struct {
		name      string
		token     string
		anonymous bool
		header    string
		read      bool
		want      bool
	}{
		{"right token", tok, false, "Bearer " + tok, true, true},
		{"scheme in any case", tok, false, "bearer " + tok, true, true},
		{"right token, a write", tok, false, "Bearer " + tok, false, true},
		{"no header", tok, false, "", true, false},
		{"wrong token", tok, false, "Bearer not-it", true, false},
		{"a prefix of the token", tok, false, "Bearer the-", true, false},
		{"the token and more", tok, false, "Bearer " + tok + "x", true, false},
		{"another scheme", tok, false, "Basic " + tok, true, false},
		{"no scheme", tok, false, tok, true, false},
		{"empty bearer", tok, false, "Bearer ", true, false},
		{"anonymous read", tok, true, "", true, true},
		{"anonymous write", tok, true, "", false, false},
		{"anonymous allowed, wrong token", tok, true, "Bearer not-it", true, false},
		{"anonymous only: any token is wrong", "", true, "Bearer " + tok, true, false},
		{"anonymous only: an empty one too", "", true, "Bearer ", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAuthorizer([]byte(tt.token), tt.anonymous)
			if got := a.allow(tt.header, tt.read); got != tt.want {
				t.Errorf("allow(%q, read %v) = %v, want %v", tt.header, tt.read, got, tt.want)
			}
		})
	}
}

func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		path string
		want string // the token, or a piece of the error
		ok   bool
	}{
		{"owner only", write("a", "tok\n", 0o600), "tok", true},
		{"owner read only", write("b", "  tok  \n", 0o400), "tok", true},
		{"group can read", write("c", "tok", 0o640), "mode 0640", false},
		{"others can read", write("d", "tok", 0o644), "mode 0644", false},
		{"group can write", write("e", "tok", 0o620), "mode 0620", false},
		{"empty", write("f", " \n", 0o600), "holds no token", false},
		{"too large", write("g", strings.Repeat("x", maxTokenFile+1), 0o600), "not a token", false},
		{"missing", filepath.Join(dir, "nope"), "no such file", false},
		{"a directory", dir, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReadToken(tt.path)
			if tt.ok {
				if err != nil || string(got) != tt.want {
					t.Fatalf("ReadToken = %q, %v; want %q", got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ReadToken = %q, %v; want an error with %q", got, err, tt.want)
			}
			var fe *TokenFileError
			if strings.HasPrefix(tt.want, "mode") && (!errors.As(err, &fe) || !strings.Contains(err.Error(), tt.path)) {
				t.Errorf("%v: want a TokenFileError naming the file", err)
			}
		})
	}
}

type fakeEngine struct{ st dispatch.Status }

func (e fakeEngine) Status() dispatch.Status { return e.st }

type fakeJournal struct{}

func (fakeJournal) Stats() (journal.Stats, error) { return journal.Stats{Path: "j.db"}, nil }
func (fakeJournal) Event(string, string) ([][]journal.Step, error) {
	return nil, nil
}

// serve runs a server with the given auth on loopback until the test ends.
func serve(t *testing.T, token string, anonymous bool) string {
	t.Helper()
	s, err := Listen(Options{
		Listen: "127.0.0.1:0", Token: []byte(token), AllowAnonymousRead: anonymous,
		Engine: fakeEngine{}, Journal: fakeJournal{}, Sources: []Source{{Name: "orders", Broker: "rabbitmq", From: "orders"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Serve(t, s.Run)
	return s.Addr()
}

// On one port, REST and gRPC refuse and admit the same calls; a refusal
// says nothing but its code.
func TestServerAuth(t *testing.T) {
	const tok = "the-token"
	tests := []struct {
		name      string
		token     string
		anonymous bool
		auth      string
		ok        bool
	}{
		{"no token", tok, false, "", false},
		{"wrong token", tok, false, "Bearer nope", false},
		{"right token", tok, false, "Bearer " + tok, true},
		{"anonymous read", "", true, "", true},
		{"anonymous read with a wrong token", tok, true, "Bearer nope", false},
		{"anonymous read, token set", tok, true, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := serve(t, tt.token, tt.anonymous)
			req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/status", nil)
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if tt.ok && resp.StatusCode != http.StatusOK {
				t.Errorf("REST: %d %s", resp.StatusCode, body)
			}
			if !tt.ok && (resp.StatusCode != http.StatusUnauthorized || len(body) != 0) {
				t.Errorf("REST: %d %q, want 401 and no body", resp.StatusCode, body)
			}

			conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx := context.Background()
			if tt.auth != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", tt.auth)
			}
			_, err = adminv1.NewAdminClient(conn).GetStatus(ctx, &adminv1.GetStatusRequest{})
			st, _ := grpcstatus.FromError(err)
			switch {
			case tt.ok && err != nil:
				t.Errorf("gRPC: %v", err)
			case !tt.ok && (st.Code() != codes.Unauthenticated || st.Message() != "" || len(st.Details()) != 0):
				t.Errorf("gRPC: %v, want Unauthenticated and nothing else", err)
			}
		})
	}
}

// The OpenAPI document needs no token; unknown paths are 404 once past the
// guard.
func TestServerOpenAPIAndUnknownPaths(t *testing.T) {
	addr := serve(t, "tok", false)
	get := func(path, auth string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("/v1/openapi.json", ""); code != http.StatusOK {
		t.Errorf("openapi.json: %d", code)
	}
	if code := get("/v1/nothing", ""); code != http.StatusUnauthorized {
		t.Errorf("/v1/nothing without a token: %d, want 401", code)
	}
	if code := get("/v1/nothing", "Bearer tok"); code != http.StatusNotFound {
		t.Errorf("/v1/nothing: %d, want 404", code)
	}
	if code := get("/v1/events/elsewhere/e1", "Bearer tok"); code != http.StatusNotFound {
		t.Errorf("an unknown source's event: %d, want 404", code)
	}
	// Escaped slashes decode to the same routes past the HTTP mux: the
	// guard must see them too.
	for _, path := range []string{"/v1%2Fstatus", "/v1%2Fevents%2Forders%2Fe1", "/v1/events%2Forders%2Fe1", "/%761/status"} {
		if code := get(path, ""); code != http.StatusUnauthorized {
			t.Errorf("%s without a token: %d, want 401", path, code)
		}
		if code := get(path, "Bearer nope"); code != http.StatusUnauthorized {
			t.Errorf("%s with a wrong token: %d, want 401", path, code)
		}
	}
}

// Anonymous reads, where allowed, reach the status and nothing else: an
// event's timeline quotes the app's answers. The same on REST, by any
// spelling of the path, and on gRPC.
func TestAnonymousReadIsTheStatusOnly(t *testing.T) {
	addr := serve(t, "tok", true)
	get := func(path string) int {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("/v1/status"); code != http.StatusOK {
		t.Errorf("anonymous status: %d, want 200", code)
	}
	for _, path := range []string{"/v1/events/orders/e1", "/v1%2Fevents%2Forders%2Fe1"} {
		if code := get(path); code != http.StatusUnauthorized {
			t.Errorf("anonymous %s: %d, want 401", path, code)
		}
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := adminv1.NewAdminClient(conn)
	if _, err := c.GetStatus(context.Background(), &adminv1.GetStatusRequest{}); err != nil {
		t.Errorf("anonymous gRPC status: %v", err)
	}
	_, err = c.GetEvent(context.Background(), &adminv1.GetEventRequest{Source: "orders", EventId: "e1"})
	if st, _ := grpcstatus.FromError(err); st.Code() != codes.Unauthenticated {
		t.Errorf("anonymous gRPC event: %v, want Unauthenticated", err)
	}
}
