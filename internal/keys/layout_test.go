package keys

import "testing"

func TestLayout(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{Tag(""), "~g"},
		{Tag("b7"), "b7"},
		{Tag("a{b}"), "a%7Bb%7D"},
		{GCRA("p:", "b7"), "p:gcra:{b7}"},
		{Block("p:", "peak", ""), "p:block:{~g}:peak"},
		{Block("p:", "per-business", "b:7"), "p:block:{b%3A7}:per-business"},
		{Pace("p:", "critical"), "p:pace:{critical}"},
		{Moved("p:", "a}b{c"), "p:pace:{a}b{c}:moved"},
		{Early("p:", "critical"), "p:pace:{critical}:early"},
		{Sweep("p:", "critical"), "p:sweep:{critical}"},
		{Sweep("p:", "a}b{c"), "p:sweep:{a}b{c}"},
		{HistorySampler("p:"), "p:hist:sampler"},
		{Plan("p:", "per-business", "b 7"), "p:plan:{b%207}:per-business"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestHistory(t *testing.T) {
	if counts, sample := History("p:", 359163444); counts != "p:hist:359163444" || sample != "p:hist:359163444:s" {
		t.Errorf("History: %q, %q", counts, sample)
	}
}
