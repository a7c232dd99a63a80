// Package buildinfo says which build of the sidecar is running: what
// `sidecar --version` prints and the handoff.build.info metric carries.
package buildinfo

import (
	"runtime/debug"
	"sync"
)

// Info is a build's identity.
type Info struct {
	// Version is the module's version ("(devel)" for a build from a
	// checkout), Revision the commit it was built from (with "-dirty" when
	// the checkout had changes), GoVersion the toolchain's.
	Version, Revision, GoVersion string
}

// version and revision are set by the linker (make build's -X flags), for
// a build that carries no version control information.
var version, revision string

// Get reads this binary's build information.
var Get = sync.OnceValue(func() Info {
	info := fromBuild()
	if version != "" {
		info.Version = version
	}
	if revision != "" {
		info.Revision = revision
	}
	return info
})

// fromBuild is what the Go toolchain recorded in the binary.
func fromBuild() Info {
	info := Info{Version: "(devel)", Revision: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	info.GoVersion = bi.GoVersion
	if v := bi.Main.Version; v != "" {
		info.Version = v
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty {
		info.Revision += "-dirty"
	}
	return info
}

// String is the version line: "(devel) 1a2b3c… go1.26".
func (i Info) String() string { return i.Version + " " + i.Revision + " " + i.GoVersion }
