package version

import (
	"runtime"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	s := String("worker")
	if !strings.HasPrefix(s, "worker taskrl ") || !strings.HasSuffix(s, runtime.Version()+")") {
		t.Fatalf("%q", s)
	}
}
