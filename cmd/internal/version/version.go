// Package version says which build of the binaries is running, for their
// --version flag and their start log line.
//
// Application code of the binaries, imported by cmd/worker and cmd/enqueue.
package version

import (
	"runtime"
	"runtime/debug"
)

// String returns e.g. "worker taskrl v1.2.0 (commit 1a2b3c4d5e6f, go1.26.8)":
// the module version the binary was built at ("(devel)" from a work tree),
// the VCS revision when the build recorded one (with "+dirty" for
// uncommitted changes), and the Go version.
func String(binary string) string {
	v, rev, dirty := "(devel)", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	out := binary + " taskrl " + v + " ("
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		out += "commit " + rev
		if dirty {
			out += "+dirty"
		}
		out += ", "
	}
	return out + runtime.Version() + ")"
}
