// Package egress decides which hosts and addresses the worker's http:call
// handler may reach: an allow list of host patterns (the worker's
// --allow-hosts, the policy file's http.allow_hosts) checked on every
// request and redirect hop, and addresses that are never dialled whatever
// the list says (link-local and cloud metadata addresses), checked on the
// address actually dialled, after DNS resolution.
//
// Foundation shared by taskrl (which validates the policy file's list) and
// cmd/internal/httpcall (which enforces it).
package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// Pattern is one entry of an allow list: an exact host name or IP address,
// or "*.example.com" (any name under example.com, not example.com itself),
// with an optional port. The zero value matches nothing.
type Pattern struct {
	host     string     // lower case, no trailing dot; the suffix after "*." when wildcard
	wildcard bool       // "*.host"
	ip       netip.Addr // set when host is an IP literal (unmapped)
	port     int        // 0: any port
}

// ParsePattern reads one allow-list entry: "api.example.com",
// "*.example.com", "api.example.com:8443", "10.1.2.3", "10.1.2.3:8080",
// "[::1]:8080" or "::1". Names are matched case-insensitively; a URL, a
// path, a "*" anywhere but a leading "*." label or a port outside 1-65535
// is an error saying so.
func ParsePattern(s string) (Pattern, error) {
	in := strings.TrimSpace(s)
	if in == "" {
		return Pattern{}, errors.New("empty host")
	}
	if strings.Contains(in, "://") {
		return Pattern{}, fmt.Errorf("%q is a URL; give the host alone, e.g. api.example.com or api.example.com:443", clip(in))
	}
	if strings.ContainsAny(in, "/?#@ \t") {
		return Pattern{}, fmt.Errorf("%q: a host may not contain '/', '?', '#', '@' or spaces", clip(in))
	}
	var p Pattern
	host := in
	switch {
	case strings.HasPrefix(in, "["): // [v6] or [v6]:port
		h, port, err := net.SplitHostPort(in)
		if err != nil {
			if !strings.HasSuffix(in, "]") {
				return Pattern{}, fmt.Errorf("%q: want [IPv6] or [IPv6]:port", clip(in))
			}
			h, port = in[1:len(in)-1], ""
		}
		host = h
		if port != "" {
			if p.port, err = parsePort(port); err != nil {
				return Pattern{}, fmt.Errorf("%q: %v", clip(in), err)
			}
		}
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() {
			return Pattern{}, fmt.Errorf("%q: not an IPv6 address in brackets", clip(in))
		}
	case strings.Count(in, ":") > 1: // a bare IPv6 address, no port
	case strings.Contains(in, ":"):
		h, port, _ := strings.Cut(in, ":")
		var err error
		if p.port, err = parsePort(port); err != nil {
			return Pattern{}, fmt.Errorf("%q: %v", clip(in), err)
		}
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return Pattern{}, fmt.Errorf("%q: an IPv6 zone is not allowed", clip(in))
		}
		p.ip = a.Unmap()
		p.host = p.ip.String()
		return p, nil
	}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		p.wildcard, host = true, rest
	}
	if err := checkName(host); err != nil {
		return Pattern{}, fmt.Errorf("%q: %v", clip(in), err)
	}
	p.host = host
	return p, nil
}

// checkName accepts a DNS name: labels of letters, digits, '-' and '_',
// 1 to 63 bytes each, 253 bytes in all.
func checkName(h string) error {
	if h == "" {
		return errors.New("no host name")
	}
	if len(h) > 253 {
		return errors.New("host name longer than 253 bytes")
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return errors.New("not a host name: empty label or one longer than 63 bytes")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			case c == '*':
				return errors.New(`"*" is allowed only as a whole first label, as in *.example.com`)
			default:
				return fmt.Errorf("not a host name: character %q", c)
			}
		}
	}
	return nil
}

func parsePort(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("port must be a number from 1 to 65535, got %q", clip(s))
	}
	return n, nil
}

// String returns the pattern in the form ParsePattern reads.
func (p Pattern) String() string {
	h := p.host
	if p.wildcard {
		h = "*." + h
	}
	if p.port == 0 {
		return h
	}
	return net.JoinHostPort(h, strconv.Itoa(p.port))
}

// matches reports whether the pattern allows host (lower case, no trailing
// dot, IP literals unmapped) on port.
func (p Pattern) matches(host string, ip netip.Addr, port int) bool {
	if p.port != 0 && p.port != port {
		return false
	}
	switch {
	case p.ip.IsValid():
		return ip.IsValid() && ip == p.ip
	case ip.IsValid():
		return false
	case p.wildcard:
		return strings.HasSuffix(host, "."+p.host)
	}
	return host == p.host
}

// Policy is an allow list of host patterns. A nil or empty Policy allows
// every host; addresses in the refused ranges (see CheckAddr) are refused
// either way. A Policy is immutable and safe for concurrent use.
type Policy struct {
	allow []Pattern
}

// New parses entries with ParsePattern into a Policy; no entries gives an
// unrestricted one. The error names the first bad entry.
func New(entries []string) (*Policy, error) {
	p := &Policy{}
	for _, e := range entries {
		pt, err := ParsePattern(e)
		if err != nil {
			return nil, err
		}
		p.allow = append(p.allow, pt)
	}
	return p, nil
}

// ParseList reads a comma-separated list of patterns (the --allow-hosts
// flag) with New; empty items are skipped.
func ParseList(s string) (*Policy, error) {
	var entries []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			entries = append(entries, e)
		}
	}
	return New(entries)
}

// Restricted reports whether the policy has an allow list.
func (p *Policy) Restricted() bool { return p != nil && len(p.allow) > 0 }

// Hosts returns the allow list in the form ParsePattern reads.
func (p *Policy) Hosts() []string {
	if p == nil {
		return nil
	}
	out := make([]string, len(p.allow))
	for i, a := range p.allow {
		out[i] = a.String()
	}
	return out
}

// RefusedError is a request the egress policy did not let out: nothing was
// sent. Retrying cannot help.
type RefusedError struct {
	Host   string // the host (or address) refused
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("egress refused: %s: %s", clip(e.Host), e.Reason)
}

// CheckURL reports whether a request to u may be sent: its host (and port,
// the scheme's default when absent) must match the allow list when there is
// one, and a host that is an IP literal must not be in the refused ranges.
// A nil error means allowed; otherwise a *RefusedError.
func (p *Policy) CheckURL(u *url.URL) error {
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	ip, _ := netip.ParseAddr(host)
	if ip.IsValid() {
		if ip.Zone() != "" {
			return &RefusedError{Host: host, Reason: "an IPv6 zone is not allowed"}
		}
		ip = ip.Unmap()
		if err := CheckAddr(ip); err != nil {
			return err
		}
	}
	if !p.Restricted() {
		return nil
	}
	port := 0
	switch ps := u.Port(); {
	case ps != "":
		port, _ = strconv.Atoi(ps)
	case strings.EqualFold(u.Scheme, "https"):
		port = 443
	default:
		port = 80
	}
	for _, a := range p.allow {
		if a.matches(host, ip, port) {
			return nil
		}
	}
	return &RefusedError{Host: net.JoinHostPort(host, strconv.Itoa(port)), Reason: "not in the allowed hosts (--allow-hosts, http.allow_hosts)"}
}

// refused are the address ranges never dialled: they reach the machine's
// cloud metadata service or link-local services, whose answers (instance
// credentials) a task's author must not get back in an error message or
// through a redirect. Loopback and private ranges are not here: internal
// services are a common, legitimate target; an allow list restricts them.
var refused = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("169.254.0.0/16"), "a link-local address (cloud metadata services live here)"},
	{netip.MustParsePrefix("fe80::/10"), "a link-local address"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "a cloud metadata address (AWS)"},
	{netip.MustParsePrefix("100.100.100.200/32"), "a cloud metadata address (Alibaba Cloud)"},
	{netip.MustParsePrefix("192.0.0.192/32"), "a cloud metadata address (Oracle Cloud)"},
	{netip.MustParsePrefix("0.0.0.0/8"), "an unspecified address (it reaches this machine)"},
	{netip.MustParsePrefix("::/128"), "an unspecified address (it reaches this machine)"},
	{netip.MustParsePrefix("224.0.0.0/4"), "a multicast address"},
	{netip.MustParsePrefix("ff00::/8"), "a multicast address"},
}

// nat64 is the well-known NAT64 prefix: its last 32 bits are an IPv4
// address that a NAT64 gateway dials.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// CheckAddr reports whether ip may be dialled: nil, or a *RefusedError when
// it lies in a refused range. IPv4-mapped IPv6 addresses (::ffff:a.b.c.d)
// and NAT64 addresses (64:ff9b::a.b.c.d) are judged by the IPv4 address
// they carry.
func CheckAddr(ip netip.Addr) error {
	ip = ip.Unmap()
	check := []netip.Addr{ip}
	if nat64.Contains(ip) {
		b := ip.As16()
		check = append(check, netip.AddrFrom4([4]byte(b[12:])))
	}
	for _, a := range check {
		for _, r := range refused {
			if r.prefix.Contains(a) {
				return &RefusedError{Host: ip.String(), Reason: r.what + ", never called"}
			}
		}
	}
	return nil
}

// Guard holds the policy in force, which the worker may replace while
// requests are under way (a policy file reload). Its zero value allows
// every host but the refused ranges. Safe for concurrent use.
type Guard struct {
	p atomic.Pointer[Policy]
}

// Set makes p the policy in force (nil: unrestricted).
func (g *Guard) Set(p *Policy) { g.p.Store(p) }

// Policy returns the policy in force (nil: unrestricted).
func (g *Guard) Policy() *Policy { return g.p.Load() }

// CheckURL is Policy().CheckURL.
func (g *Guard) CheckURL(u *url.URL) error { return g.Policy().CheckURL(u) }

// Control is a net.Dialer Control function: it refuses to connect to an
// address in the refused ranges. It runs on the address actually dialled,
// after DNS resolution, so a name that resolves (or rebinds) to a metadata
// address is refused too.
func (g *Guard) Control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &RefusedError{Host: address, Reason: "not an IP address and port"}
	}
	return CheckAddr(ap.Addr())
}

// clip bounds user data quoted in a message.
func clip(s string) string {
	if len(s) <= 100 {
		return s
	}
	return strings.ToValidUTF8(s[:100], "") + "…"
}
