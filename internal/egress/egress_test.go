package egress

import (
	"errors"
	"net/netip"
	"net/url"
	"strings"
	"testing"
)

func TestParsePattern(t *testing.T) {
	for in, want := range map[string]string{
		"api.example.com":       "api.example.com",
		"API.Example.COM.":      "api.example.com",
		"*.example.com":         "*.example.com",
		"*.example.com:443":     "*.example.com:443",
		"api.example.com:8443":  "api.example.com:8443",
		"10.1.2.3":              "10.1.2.3",
		"10.1.2.3:8080":         "10.1.2.3:8080",
		"::1":                   "::1",
		"[::1]":                 "::1",
		"[::1]:8080":            "[::1]:8080",
		"[::ffff:10.1.2.3]:80":  "10.1.2.3:80",
		" internal_svc.local ":  "internal_svc.local",
		"localhost":             "localhost",
		"xn--bcher-kva.example": "xn--bcher-kva.example",
	} {
		p, err := ParsePattern(in)
		if err != nil || p.String() != want {
			t.Errorf("ParsePattern(%q) = %q, %v; want %q", in, p.String(), err, want)
		}
	}
	for in, want := range map[string]string{
		"":                        "empty host",
		"https://api.example.com": "is a URL",
		"api.example.com/v1":      "may not contain",
		"user@api.example.com":    "may not contain",
		"api.example.com:0":       "port must be",
		"api.example.com:99999":   "port must be",
		"api.example.com:http":    "port must be",
		"a.*.example.com":         `"*" is allowed only`,
		"*example.com":            `"*" is allowed only`,
		"*":                       `"*" is allowed only`,
		"*.":                      `"*" is allowed only`,
		"exa mple.com":            "may not contain",
		"a..b":                    "empty label",
		"[10.1.2.3]:80":           "not an IPv6 address",
		"[::1":                    "want [IPv6]",
		"[fe80::1%eth0]":          "zone",
		"bücher.example":          "not a host name",
		strings.Repeat("a", 64):   "longer than 63",
	} {
		_, err := ParsePattern(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParsePattern(%q): %v; want an error containing %q", in, err, want)
		}
	}
}

func TestCheckURL(t *testing.T) {
	p, err := ParseList("api.example.com, *.vendor.io:443, 127.0.0.1:8080, [::1]:9090,internal")
	if err != nil {
		t.Fatal(err)
	}
	allowed := []string{
		"https://api.example.com/v1",
		"http://API.EXAMPLE.COM./x",
		"http://api.example.com:1234/",
		"https://eu.vendor.io/x",
		"https://a.b.vendor.io:443/x",
		"http://127.0.0.1:8080/",
		"http://[::ffff:127.0.0.1]:8080/",
		"http://[::1]:9090/",
		"http://internal/",
	}
	for _, s := range allowed {
		if err := p.CheckURL(mustURL(t, s)); err != nil {
			t.Errorf("CheckURL(%s): %v; want allowed", s, err)
		}
	}
	refused := map[string]string{
		"https://example.com/":                     "not in the allowed hosts",
		"https://api.example.com.evil.net/":        "not in the allowed hosts",
		"https://evilapi.example.com/":             "not in the allowed hosts",
		"https://vendor.io/":                       "not in the allowed hosts",
		"http://eu.vendor.io/":                     "not in the allowed hosts", // port 80
		"https://eu.vendor.io:8443/":               "not in the allowed hosts",
		"http://127.0.0.1:8081/":                   "not in the allowed hosts",
		"http://127.0.0.1/":                        "not in the allowed hosts",
		"http://[::1]:8080/":                       "not in the allowed hosts",
		"http://localhost:8080/":                   "not in the allowed hosts",
		"http://169.254.169.254/latest/meta-data/": "link-local",
		"http://[::ffff:169.254.169.254]/":         "link-local",
		"http://[::ffff:a9fe:a9fe]/":               "link-local",
		"http://[64:ff9b::a9fe:a9fe]/":             "link-local",
		"http://[fd00:ec2::254]/":                  "metadata",
		"http://100.100.100.200/":                  "metadata",
		"http://0.0.0.0:8080/":                     "unspecified",
		"http://[fe80::1%25eth0]/":                 "zone",
	}
	for s, want := range refused {
		err := p.CheckURL(mustURL(t, s))
		var re *RefusedError
		if !errors.As(err, &re) || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckURL(%s): %v; want a RefusedError containing %q", s, err, want)
		}
	}
	// Unrestricted: any host, but never the refused ranges.
	var open *Policy
	for _, s := range []string{"https://example.com/", "http://127.0.0.1:1/", "http://10.0.0.1/", "http://[::1]/"} {
		if err := open.CheckURL(mustURL(t, s)); err != nil {
			t.Errorf("unrestricted CheckURL(%s): %v", s, err)
		}
	}
	for _, s := range []string{"http://169.254.169.254/", "http://[::ffff:169.254.169.254]/", "http://[fe80::1]/"} {
		if err := open.CheckURL(mustURL(t, s)); err == nil {
			t.Errorf("unrestricted CheckURL(%s) allowed a refused address", s)
		}
	}
}

func TestControl(t *testing.T) {
	var g Guard
	for addr, ok := range map[string]bool{
		"127.0.0.1:80":                true,
		"10.0.0.7:443":                true,
		"[::1]:80":                    true,
		"[2001:db8::1]:443":           true,
		"169.254.169.254:80":          false,
		"169.254.170.2:80":            false,
		"[::ffff:169.254.169.254]:80": false,
		"[64:ff9b::a9fe:a9fe]:80":     false,
		"[fe80::1]:80":                false,
		"[fd00:ec2::254]:80":          false,
		"0.0.0.0:80":                  false,
		"[::]:80":                     false,
		"224.0.0.1:80":                false,
		"not-an-address:80":           false,
	} {
		err := g.Control("tcp", addr, nil)
		if (err == nil) != ok {
			t.Errorf("Control(%s) = %v; want allowed %v", addr, err, ok)
		}
	}
	// The allow list applies to URLs, not to dialled addresses.
	p, _ := New([]string{"api.example.com"})
	g.Set(p)
	if err := g.Control("tcp", "10.0.0.7:443", nil); err != nil {
		t.Errorf("Control with an allow list: %v", err)
	}
	if !g.Policy().Restricted() || g.Policy().Hosts()[0] != "api.example.com" {
		t.Errorf("Policy() = %v", g.Policy().Hosts())
	}
}

func TestCheckAddrMapped(t *testing.T) {
	// Every refused IPv4 range is refused in its mapped and NAT64 forms.
	for _, s := range []string{"169.254.1.1", "100.100.100.200", "192.0.0.192", "0.0.0.0"} {
		v4 := netip.MustParseAddr(s)
		b := v4.As4()
		mapped := netip.AddrFrom16([16]byte{10: 0xff, 11: 0xff, 12: b[0], 13: b[1], 14: b[2], 15: b[3]})
		n64 := netip.AddrFrom16([16]byte{0: 0x00, 1: 0x64, 2: 0xff, 3: 0x9b, 12: b[0], 13: b[1], 14: b[2], 15: b[3]})
		for _, a := range []netip.Addr{v4, mapped, n64} {
			if CheckAddr(a) == nil {
				t.Errorf("CheckAddr(%s) allowed", a)
			}
		}
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// FuzzEgress: patterns print back as themselves, and no URL whose host is
// an address in a refused range, in any spelling net/netip accepts, is
// ever allowed, restricted or not.
func FuzzEgress(f *testing.F) {
	for _, s := range []string{"api.example.com", "*.example.com:443", "[::1]:8080", "10.1.2.3", "http://169.254.169.254/", "http://[::ffff:a9fe:a9fe]/x", "https://a.example.com:443/p?q"} {
		f.Add(s)
	}
	open := &Policy{}
	wide, _ := New([]string{"169.254.169.254", "[fe80::1]", "*.com", "localhost"})
	f.Fuzz(func(t *testing.T, s string) {
		if p, err := ParsePattern(s); err == nil {
			q, err := ParsePattern(p.String())
			if err != nil || q != p {
				t.Fatalf("ParsePattern(%q) = %v; its String %q parses as %v, %v", s, p, p.String(), q, err)
			}
		}
		u, err := url.Parse(s)
		if err != nil {
			return
		}
		ip, err := netip.ParseAddr(u.Hostname())
		if err != nil || CheckAddr(ip) == nil {
			return
		}
		for _, p := range []*Policy{nil, open, wide} {
			if p.CheckURL(u) == nil {
				t.Fatalf("%q (address %s) allowed", s, ip)
			}
		}
	})
}
