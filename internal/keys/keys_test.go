package keys

import (
	"strings"
	"testing"
)

func checkEncoded(t *testing.T, id, e string) {
	t.Helper()
	if len(e) == 0 || len(e) > MaxEncoded {
		t.Fatalf("Encode(%q) = %q: length %d outside 1..%d", id, e, len(e), MaxEncoded)
	}
	for i := 0; i < len(e); i++ {
		c := e[i]
		if !(safe(c) || c == '%' || c == '~') {
			t.Fatalf("Encode(%q) = %q contains %q", id, e, c)
		}
	}
}

func TestEncode(t *testing.T) {
	long := strings.Repeat("x", 10<<10)
	cases := map[string]string{
		"b7":                          "b7",
		"cust_42.eu-1":                "cust_42.eu-1",
		"b:7":                         "b%3A7",
		"{b7}":                        "%7Bb7%7D",
		"a\nb":                        "a%0Ab",
		"~x":                          "%7Ex",
		"%41":                         "%2541",
		strings.Repeat("a", 64):       strings.Repeat("a", 64),
		strings.Repeat("a", 65):       hashed(strings.Repeat("a", 65)),
		"":                            hashed(""),
		long:                          hashed(long),
		strings.Repeat(":", 21):       strings.Repeat("%3A", 21),
		strings.Repeat(":", 22):       hashed(strings.Repeat(":", 22)),
		strings.Repeat("a", 62) + ":": hashed(strings.Repeat("a", 62) + ":"),
	}
	for id, want := range cases {
		got := Encode(id)
		if got != want {
			t.Errorf("Encode(%.20q) = %q, want %q", id, got, want)
		}
		checkEncoded(t, id, got)
	}
}

// FuzzEncode checks that encodings are bounded, tag-safe and injective.
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", "b7", "{", "}", ":", "\n", "%7B", "~abc", strings.Repeat("z", 100)} {
		f.Add(s, s+"x")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ea, eb := Encode(a), Encode(b)
		checkEncoded(t, a, ea)
		checkEncoded(t, b, eb)
		if a != b && ea == eb {
			t.Fatalf("Encode(%q) == Encode(%q) == %q", a, b, ea)
		}
		if Encode(a) != ea {
			t.Fatalf("Encode(%q) is not deterministic", a)
		}
	})
}

func TestValidatePrefix(t *testing.T) {
	for _, ok := range []string{"", "taskrl:", "app.prod:rl:"} {
		if err := ValidatePrefix(ok); err != nil {
			t.Errorf("ValidatePrefix(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"a{b", "a}", "with space", "tab\t", "é", strings.Repeat("p", 65)} {
		if err := ValidatePrefix(bad); err == nil {
			t.Errorf("ValidatePrefix(%q) = nil, want error", bad)
		}
	}
}

func TestDecode(t *testing.T) {
	for _, id := range []string{"b7", "acme corp", "tenant:{7}", "ü", strings.Repeat("x", 64)} {
		if got, ok := Decode(Encode(id)); !ok || got != id {
			t.Errorf("Decode(Encode(%q)) = %q, %v", id, got, ok)
		}
	}
	for _, enc := range []string{Encode(strings.Repeat("x", 65)), Encode(""), "", "a%2", "a%zz", "a b"} {
		if got, ok := Decode(enc); ok {
			t.Errorf("Decode(%q) = %q, want no identifier", enc, got)
		}
	}
}
