package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// dockerStage is one FROM … AS name stage of the Dockerfile.
type dockerStage struct {
	from, name string
	lines      []string // instructions after FROM, continuation lines joined
}

func readDockerfile(t *testing.T, path string) []dockerStage {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stages []dockerStage
	var cur string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if c, ok := strings.CutSuffix(l, "\\"); ok {
			cur += c + " "
			continue
		}
		l, cur = cur+l, ""
		if f := strings.Fields(l); strings.EqualFold(f[0], "FROM") {
			st := dockerStage{from: f[1]}
			if len(f) == 4 && strings.EqualFold(f[2], "AS") {
				st.name = f[3]
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) == 0 {
			t.Fatalf("instruction before FROM: %s", l)
		}
		stages[len(stages)-1].lines = append(stages[len(stages)-1].lines, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return stages
}

// The images cannot be built here (no container runtime), so this checks
// what can go wrong without one: the build stage runs what `make build`
// runs, statically, and each image copies a binary that command makes,
// onto a distroless base, as a user that is not root, with it as the
// entrypoint; and `make image` builds the stages that exist.
func TestDockerfileBuildsWhatMakeBuilds(t *testing.T) {
	root := filepath.Join("..", "..")
	stages := readDockerfile(t, filepath.Join(root, "Dockerfile"))
	i := slices.IndexFunc(stages, func(s dockerStage) bool { return s.name == "build" })
	if i < 0 {
		t.Fatal("no build stage")
	}
	build := stages[i]
	if !slices.Contains(build.lines, "RUN make build") {
		t.Errorf("the build stage runs %q, not `make build`", build.lines)
	}
	if !slices.ContainsFunc(build.lines, func(l string) bool { return strings.HasPrefix(l, "ENV ") && strings.Contains(l, "CGO_ENABLED=0") }) {
		t.Error("the build stage does not set CGO_ENABLED=0: the binaries would need a libc the images lack")
	}

	out, err := exec.Command("make", "-s", "-n", "-C", root, "build").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n build: %v\n%s", err, out)
	}
	made := map[string]bool{}
	for _, m := range regexp.MustCompile(`build .*?-o (bin/\S+) `).FindAllStringSubmatch(string(out), -1) {
		made[m[1]] = true
	}
	var targets []string
	for _, st := range stages {
		if st.name == "build" {
			continue
		}
		targets = append(targets, st.name)
		if !strings.HasPrefix(st.from, "gcr.io/distroless/static") {
			t.Errorf("stage %s is based on %s, want distroless static", st.name, st.from)
		}
		var bin string
		for _, l := range st.lines {
			f := strings.Fields(l)
			switch {
			case f[0] == "COPY" && len(f) == 4 && f[1] == "--from=build":
				if !made[strings.TrimPrefix(f[2], "/src/")] {
					t.Errorf("stage %s copies %s, which make build does not make (it makes %v)", st.name, f[2], made)
				}
				bin = f[3]
			case f[0] == "USER" && (f[1] == "root" || strings.HasPrefix(f[1], "0")):
				t.Errorf("stage %s runs as root", st.name)
			case f[0] == "ENTRYPOINT" && bin != "" && l != `ENTRYPOINT ["`+bin+`"]`:
				t.Errorf("stage %s: %s, want %s as the entrypoint", st.name, l, bin)
			}
		}
		if !slices.ContainsFunc(st.lines, func(l string) bool { return strings.HasPrefix(l, "USER 65532") }) {
			t.Errorf("stage %s sets no user of its own", st.name)
		}
	}

	out, err = exec.Command("make", "-s", "-n", "-C", root, "image").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n image: %v\n%s", err, out)
	}
	for _, target := range targets {
		if !strings.Contains(string(out), "--target "+target+" ") {
			t.Errorf("make image does not build the stage %s:\n%s", target, out)
		}
	}
}
