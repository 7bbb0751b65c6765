package httpcall

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/egress"
)

// guardedHandler returns a handler whose client enforces the allow list
// hosts (none: unrestricted), and the classes it reports.
func guardedHandler(t *testing.T, hosts ...string) (asynq.Handler, *classes) {
	t.Helper()
	p, err := egress.New(hosts)
	if err != nil {
		t.Fatal(err)
	}
	g := new(egress.Guard)
	g.Set(p)
	c := &classes{}
	return NewHandler(NewClient(0, g), WithResultHook(c.hook)), c
}

// wantRefused checks that err archives the task with the egress policy's
// reason, containing why.
func wantRefused(t *testing.T, err error, why string) {
	t.Helper()
	if !errors.Is(err, asynq.SkipRetry) || !strings.Contains(err.Error(), "egress refused") || !strings.Contains(err.Error(), why) {
		t.Fatalf("got %v; want a SkipRetry error saying egress refused: %s", err, why)
	}
}

func hostOf(srv *recorder) string { return strings.TrimPrefix(srv.URL, "http://") }

func TestEgressAllowList(t *testing.T) {
	allowed := newRecorder(t, nil)
	other := newRecorder(t, nil)
	h, c := guardedHandler(t, hostOf(allowed))

	// An allowed host still works end to end.
	if err := h.ProcessTask(context.Background(), task(t, map[string]any{"url": allowed.URL + "/ok"})); err != nil {
		t.Fatalf("allowed host: %v", err)
	}
	// A host that is not on the list: nothing is sent.
	err := h.ProcessTask(context.Background(), task(t, map[string]any{"url": other.URL + "/x", "headers": map[string]string{"Authorization": "Bearer S3CRET"}}))
	wantRefused(t, err, "not in the allowed hosts")
	if strings.Contains(err.Error(), "S3CRET") {
		t.Errorf("the error shows a header value: %v", err)
	}
	// The allowed address by a name that is not on the list: refused; as
	// an IPv4-mapped IPv6 literal: the same address, allowed.
	port := strconv.Itoa(allowed.Listener.Addr().(*net.TCPAddr).Port)
	err = h.ProcessTask(context.Background(), task(t, map[string]any{"url": "http://localhost:" + port + "/x"}))
	wantRefused(t, err, "not in the allowed hosts")
	if err := h.ProcessTask(context.Background(), task(t, map[string]any{"url": "http://[::ffff:127.0.0.1]:" + port + "/mapped"})); err != nil {
		t.Fatalf("allowed address as an IPv4-mapped literal: %v", err)
	}
	if n := len(other.requests()); n != 0 {
		t.Errorf("the refused host got %d requests", n)
	}
	if n := len(allowed.requests()); n != 2 {
		t.Errorf("the allowed host got %d requests, want 2", n)
	}
	c.want(t, Class2xx, ClassRefused, ClassRefused, Class2xx)
}

func TestEgressMetadataRefused(t *testing.T) {
	h, c := guardedHandler(t) // no allow list: every host but the refused ranges
	for _, u := range []string{
		"http://169.254.169.254/latest/meta-data/iam/security-credentials/",
		"http://[::ffff:169.254.169.254]/latest/meta-data/",
		"http://[::ffff:a9fe:a9fe]/",
		"http://[fd00:ec2::254]/",
		"http://[fe80::1]:8080/",
		"http://0.0.0.0:80/",
	} {
		err := h.ProcessTask(context.Background(), task(t, map[string]any{"url": u}))
		wantRefused(t, err, "never called")
	}
	c.want(t, ClassRefused, ClassRefused, ClassRefused, ClassRefused, ClassRefused, ClassRefused)
}

func TestEgressRedirects(t *testing.T) {
	forbidden := newRecorder(t, nil)
	second := newRecorder(t, nil)
	first := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/to-forbidden":
			http.Redirect(w, r, forbidden.URL+"/stolen", http.StatusFound)
		case "/to-metadata":
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/", http.StatusFound)
		case "/to-second":
			http.Redirect(w, r, second.URL+"/landed", http.StatusTemporaryRedirect)
		case "/same-host":
			http.Redirect(w, r, "/landed", http.StatusFound)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		}
	})
	h, c := guardedHandler(t, hostOf(first), hostOf(second))
	secret := map[string]string{"Authorization": "Bearer S3CRET", "X-Api-Key": "K3Y", "Cookie": "s=1", "Accept": "application/json"}
	call := func(path string) error {
		return h.ProcessTask(context.Background(), task(t, map[string]any{"url": first.URL + path, "business_id": "b7", "headers": secret, "body": map[string]int{"n": 1}}))
	}

	wantRefused(t, call("/to-forbidden"), "not in the allowed hosts")
	wantRefused(t, call("/to-metadata"), "never called")
	if n := len(forbidden.requests()); n != 0 {
		t.Errorf("the forbidden host got %d requests", n)
	}

	// To another allowed host: the payload's headers and credentials stay
	// behind, the handler's own go on.
	if err := call("/to-second"); err != nil {
		t.Fatalf("redirect to an allowed host: %v", err)
	}
	got := second.only(t)
	for _, k := range []string{"Authorization", "X-Api-Key", "Cookie", "Accept"} {
		if v := got.Header.Get(k); v != "" {
			t.Errorf("redirect to another host carried %s: %q", k, v)
		}
	}
	if got.Header.Get("Idempotency-Key") != "orig-1" || got.Header.Get("X-Business-ID") != "b7" || got.Body != `{"n":1}` {
		t.Errorf("redirected request lost the handler's headers or its body: %v %q", got.Header, got.Body)
	}
	// On the same host they stay.
	if err := call("/same-host"); err != nil {
		t.Fatalf("redirect on the same host: %v", err)
	}
	var landed request
	for _, r := range first.requests() {
		if r.Path == "/landed" {
			landed = r
		}
	}
	if landed.Header.Get("Authorization") != "Bearer S3CRET" || landed.Header.Get("X-Api-Key") != "K3Y" {
		t.Errorf("redirect on the same host dropped the payload's headers: %v", landed.Header)
	}

	// A loop stops after MaxRedirects and is archived.
	before := len(first.requests())
	err := call("/loop")
	if !errors.Is(err, asynq.SkipRetry) || !strings.Contains(err.Error(), "redirects") {
		t.Fatalf("redirect loop: %v; want a SkipRetry error about redirects", err)
	}
	if n := len(first.requests()) - before; n != MaxRedirects+1 {
		t.Errorf("redirect loop: %d requests, want %d", n, MaxRedirects+1)
	}
	c.want(t, ClassRefused, ClassRefused, Class2xx, Class2xx, ClassOther)
}

// TestEgressDNS checks the address actually dialled: a name that resolves
// to a metadata address is refused however it is written, while one that
// resolves to an ordinary address is called.
func TestEgressDNS(t *testing.T) {
	srv := newRecorder(t, nil)
	port := strconv.Itoa(srv.Listener.Addr().(*net.TCPAddr).Port)
	fakeDNS(t, map[string]netip.Addr{
		"metadata.test.":    netip.MustParseAddr("169.254.169.254"),
		"rebound.test.":     netip.MustParseAddr("169.254.170.2"),
		"api.test.":         netip.MustParseAddr("127.0.0.1"),
		"mapped.test.":      netip.MustParseAddr("::ffff:169.254.169.254"),
		"nat64.test.":       netip.MustParseAddr("64:ff9b::a9fe:a9fe"),
		"linklocal6.test.":  netip.MustParseAddr("fe80::1"),
		"unspecified.test.": netip.MustParseAddr("0.0.0.0"),
	})
	// On the allow list by name: the name passes, the address does not.
	h, _ := guardedHandler(t, "*.test")
	for _, name := range []string{"metadata.test", "rebound.test", "mapped.test", "nat64.test", "linklocal6.test", "unspecified.test"} {
		err := h.ProcessTask(context.Background(), task(t, map[string]any{"url": "http://" + name + ":" + port + "/x"}))
		wantRefused(t, err, "never called")
	}
	if err := h.ProcessTask(context.Background(), task(t, map[string]any{"url": "http://api.test:" + port + "/ok"})); err != nil {
		t.Fatalf("a name resolving to an ordinary address: %v", err)
	}
	if got := srv.only(t); got.Host != "api.test:"+port {
		t.Errorf("request Host %q", got.Host)
	}
}

// fakeDNS makes NewClient's connections resolve the given names (A and
// AAAA, by the address's family) through a stand-in DNS server, for the
// test's duration.
func fakeDNS(t *testing.T, names map[string]netip.Addr) {
	t.Helper()
	resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		client, server := net.Pipe()
		go serveDNS(server, names)
		return client, nil
	}}
	t.Cleanup(func() { resolver = nil })
}

// serveDNS answers the DNS queries on one stream connection (two-byte
// length prefix): one record for a known name of the asked type, none
// otherwise.
func serveDNS(conn net.Conn, names map[string]netip.Addr) {
	defer conn.Close()
	for {
		var n uint16
		if binary.Read(conn, binary.BigEndian, &n) != nil {
			return
		}
		q := make([]byte, n)
		if _, err := io.ReadFull(conn, q); err != nil || len(q) < 12 {
			return
		}
		// The question: labels up to a zero byte, then type and class.
		i := 12
		var labels []string
		for i < len(q) && q[i] != 0 {
			l := int(q[i])
			if i+1+l > len(q) {
				return
			}
			labels = append(labels, string(q[i+1:i+1+l]))
			i += 1 + l
		}
		end := i + 5
		if end > len(q) {
			return
		}
		qtype := binary.BigEndian.Uint16(q[i+1:])
		name := strings.ToLower(strings.Join(labels, ".")) + "."
		var rdata []byte
		if a, ok := names[name]; ok {
			switch {
			case qtype == 1 && a.Is4():
				b := a.As4()
				rdata = b[:]
			case qtype == 28 && a.Is6():
				b := a.As16()
				rdata = b[:]
			}
		}
		resp := append([]byte{}, q[:2]...)                      // id
		resp = append(resp, 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0) // QR RD RA, one question
		if rdata != nil {
			resp[7] = 1 // one answer
		}
		resp = append(resp, q[12:end]...)
		if rdata != nil {
			resp = append(resp, 0xc0, 12) // the question's name
			resp = binary.BigEndian.AppendUint16(resp, qtype)
			resp = append(resp, 0, 1, 0, 0, 0, 60) // IN, TTL 60
			resp = binary.BigEndian.AppendUint16(resp, uint16(len(rdata)))
			resp = append(resp, rdata...)
		}
		out := binary.BigEndian.AppendUint16(nil, uint16(len(resp)))
		if _, err := conn.Write(append(out, resp...)); err != nil {
			return
		}
	}
}
