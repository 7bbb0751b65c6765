package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/taskrl/taskrl/policy"
)

// TestHTTPConf: the policy file's http section is read by the worker, its
// errors named by line and field like the library's.
func TestHTTPConf(t *testing.T) {
	const costly = goodPolicy + "    cost: \"{{.units}}\"\n" +
		"  - name: flat\n    match: {queue: q}\n    gcra: {rate: 1, per: 1s}\n"
	p, err := policy.Parse([]byte(costly))
	if err != nil {
		t.Fatal(err)
	}
	hc, err := parseHTTPConf("", []byte("http:\n  allow_hosts: [API.example.com, \"*.vendor.io:443\", \"[::1]:8080\"]\n  settle_headers:\n    - {rule: peak, header: X-Actual-Cost}\n"+costly), p)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(hc.allowHosts, " "); got != "api.example.com *.vendor.io:443 [::1]:8080" || len(hc.settle) != 1 || hc.settle["peak"] != "X-Actual-Cost" {
		t.Fatalf("read %+v", hc)
	}
	if hc, err := parseHTTPConf("", []byte(costly), p); err != nil || hc.allowHosts != nil || hc.settle != nil {
		t.Fatalf("no http section: %+v, %v", hc, err)
	}
	for _, tc := range []struct{ name, http, want string }{
		{"not a mapping", "http: [a]\n", `policy f.yaml: line 1: http: must be a mapping, got a list`},
		{"unknown field", "http:\n  allow: [a]\n", `policy f.yaml: line 2: http.allow: unknown field; expected allow_hosts or settle_headers`},
		{"allow_hosts not a list", "http: {allow_hosts: api.example.com}\n", `policy f.yaml: line 1: http.allow_hosts: must be a list of hosts such as [api.example.com, "*.example.net:443"], got the string "api.example.com"`},
		{"allow_hosts a URL", "http:\n  allow_hosts:\n    - api.example.com\n    - https://x.example.com\n", `policy f.yaml: line 4: http.allow_hosts[2]: "https://x.example.com" is a URL; give the host alone, e.g. api.example.com or api.example.com:443`},
		{"allow_hosts bad port", "http:\n  allow_hosts: [\"api.example.com:0\"]\n", `policy f.yaml: line 2: http.allow_hosts[1]: "api.example.com:0": port must be a number from 1 to 65535, got "0"`},
		{"allow_hosts inner star", "http:\n  allow_hosts: [\"api.*.com\"]\n", `policy f.yaml: line 2: http.allow_hosts[1]: "api.*.com": "*" is allowed only as a whole first label, as in *.example.com`},
		{"allow_hosts not a string", "http:\n  allow_hosts: [{a: 1}]\n", `policy f.yaml: line 2: http.allow_hosts[1]: must be a string, got a mapping`},
		{"settle_headers not a list", "http: {settle_headers: {rule: peak}}\n", `policy f.yaml: line 1: http.settle_headers: must be a list such as - {rule: vendor-points, header: X-Actual-Cost}, got a mapping`},
		{"settle unknown rule", "http:\n  settle_headers:\n    - {rule: nope, header: X-Cost}\n", `policy f.yaml: line 3: http.settle_headers[1].rule: no rule is named "nope"`},
		{"settle without cost", "http:\n  settle_headers:\n    - {rule: flat, header: X-Cost}\n", `policy f.yaml: line 3: http.settle_headers[1].rule: rule "flat" has no cost to settle`},
		{"settle twice", "http:\n  settle_headers:\n    - {rule: peak, header: X-Cost}\n    - {rule: peak, header: X-Other}\n", `policy f.yaml: line 4: http.settle_headers[2].rule: rule "peak" already has its header, http.settle_headers[1]`},
		{"settle not a header", "http:\n  settle_headers:\n    - {rule: peak, header: \"X Cost\"}\n", `policy f.yaml: line 3: http.settle_headers[1].header: must be an HTTP header name such as X-Actual-Cost, got "X Cost"`},
		{"settle unknown field", "http:\n  settle_headers:\n    - {rule: peak, name: X-Cost}\n", `policy f.yaml: line 3: http.settle_headers[1].name: unknown field; expected rule or header`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseHTTPConf("f.yaml", []byte(tc.http+costly), p)
			var pe *policy.Error
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) || !errors.As(err, &pe) {
				t.Errorf("got  %v\nwant %s", err, tc.want)
			}
		})
	}
}

// TestHTTPConfWithPolicyErrors: a file wrong in its rules and in its http
// section is refused with both, each on its line.
func TestHTTPConfWithPolicyErrors(t *testing.T) {
	path := writePolicy(t, "http:\n  allow_hosts: [\"https://a.example.com\"]\n  settle_headers: [{rule: nope, header: X-Cost}]\n"+
		"rules:\n  - name: a\n    match: {type: \"http:call\"}\n    gcra: {rate: -1, per: 1s}\n")
	var stdout, stderr bytes.Buffer
	if code := cli(context.Background(), []string{"--check", "--policy", path}, noEnv, &stdout, &stderr); code != exitUsage {
		t.Fatalf("exit %d", code)
	}
	want := "policy " + path + ": line 7: rule \"a\": gcra.rate: must be a positive number, got -1\n" +
		"policy " + path + ": line 2: http.allow_hosts[1]: \"https://a.example.com\" is a URL; give the host alone, e.g. api.example.com or api.example.com:443\n"
	if stderr.String() != want {
		t.Errorf("got\n%s\nwant\n%s", stderr.String(), want)
	}
}

// TestDocHTTPConf: the http sections of docs/policy.md's examples are
// accepted by the worker, with the rules of their own example.
func TestDocHTTPConf(t *testing.T) {
	b, err := os.ReadFile("../../docs/policy.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)\n```").FindAllStringSubmatch(string(b), -1) {
		doc := []byte(m[1] + "\n")
		if !strings.Contains(m[1], "\nhttp:") && !strings.HasPrefix(m[1], "http:") {
			continue
		}
		n++
		p, err := policy.Parse(doc)
		if err != nil {
			t.Fatalf("docs/policy.md example:\n%s\nrefused: %v", doc, err)
		}
		if _, err := parseHTTPConf("", doc, p); err != nil {
			t.Errorf("docs/policy.md example:\n%s\nhttp section refused: %v", doc, err)
		}
	}
	if n < 2 {
		t.Errorf("found %d examples with an http section in docs/policy.md, want at least 2", n)
	}
}
