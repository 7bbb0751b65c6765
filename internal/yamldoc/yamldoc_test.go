package yamldoc

import (
	"testing"
	"time"
)

type limitDoc struct {
	Rate  Val[float64]       `yaml:"rate"`
	Per   Val[time.Duration] `yaml:"per"`
	Share Val[Share]         `yaml:"share"`
}

type doc struct {
	Name   Val[string]           `yaml:"name"`
	Limits List[Block[limitDoc]] `yaml:"limits"`
}

// TestRead: values decode with their lines; a wrong one is kept, named by
// the Reader, and does not stop the others decoding.
func TestRead(t *testing.T) {
	var b Block[doc]
	if p := Decode([]byte("name: a\nlimits:\n  - {rate: 5, per: 1s, share: 10%}\n  - rate: x\n    per: 2\n"), "", &b); p != nil {
		t.Fatal(p)
	}
	var r Reader
	d := Must(&r, "", 0, &b)
	if name, ok := Get(&r, "name", d.Name); !ok || name != "a" {
		t.Fatalf("name %q %v", name, ok)
	}
	ls := Entries(&r, "limits", &d.Limits, "a list")
	l := Open(&r, "limits[1]", &ls[0])
	if rate, _ := Get(&r, "limits[1].rate", l.Rate); rate != 5 || l.Per.V != time.Second || l.Share.V != 0.1 || r.First != nil {
		t.Fatalf("first entry %+v, %v", l, r.First)
	}
	l = Open(&r, "limits[2]", &ls[1])
	Get(&r, "limits[2].rate", l.Rate)
	Get(&r, "limits[2].per", l.Per)
	if r.First == nil || *r.First != (Problem{Field: "limits[2].rate", Line: 4, Msg: `must be a number, got the string "x"`}) {
		t.Fatalf("problem %+v", r.First)
	}
	if r.Lines.Of("limits[2].per") != 5 || r.Lines.Of("limits[2].other") != 4 {
		t.Fatalf("lines %v", r.Lines)
	}
}

// TestDecodeSection: one key is decoded, strictly, the others ignored;
// anchors defined elsewhere in the document resolve.
func TestDecodeSection(t *testing.T) {
	var b Block[limitDoc]
	if p := DecodeSection([]byte("other: &p 1s\nsection: {rate: 1, per: *p}\n"), "section", &b); p != nil || b.V.Per.V != time.Second {
		t.Fatalf("%v %+v", p, b)
	}
	b = Block[limitDoc]{}
	if p := DecodeSection([]byte("other: 1\n"), "section", &b); p != nil || b.Set {
		t.Fatalf("absent: %v %+v", p, b)
	}
	DecodeSection([]byte("section: {rate: 1, burst: 2}\n"), "section", &b)
	if b.Bad == nil || b.Bad.Field != "burst" || b.Bad.Msg != "unknown field; expected rate, per or share" {
		t.Fatalf("unknown field: %+v", b.Bad)
	}
}
