package main

import (
	"errors"
	"fmt"

	"github.com/taskrl/taskrl/cmd/internal/httpcall"
	"github.com/taskrl/taskrl/internal/egress"
	"github.com/taskrl/taskrl/internal/yamldoc"
	"github.com/taskrl/taskrl/policy"
)

// httpConf is the worker's own section of its policy file, http: the
// settings of its http:call handler, which the library does not read
// (policy.Parse accepts the section and skips it):
//
//	http:
//	  allow_hosts: [api.example.com, "*.example.net:443"]
//	  settle_headers:
//	    - {rule: vendor-points, header: X-Actual-Cost}
//
// allow_hosts: the only hosts http:call may call (egress.ParsePattern;
// --allow-hosts beats it); none, the default, means unrestricted.
// settle_headers: for rules with a cost, the response header that carries
// a call's actual cost under the rule (taskrl.SettleFromHeaders); none by
// default. The zero httpConf is an absent section.
type httpConf struct {
	allowHosts []string          // in canonical form; nil: unrestricted
	settle     map[string]string // rule name → header; nil: none
}

// httpDoc is the http section as decoded.
type httpDoc struct {
	AllowHosts    yamldoc.List[yamldoc.Val[string]]      `yaml:"allow_hosts"`
	SettleHeaders yamldoc.List[yamldoc.Block[settleDoc]] `yaml:"settle_headers"`
}

// settleDoc is an entry of http.settle_headers.
type settleDoc struct {
	Rule   yamldoc.Val[string] `yaml:"rule"`
	Header yamldoc.Val[string] `yaml:"header"`
}

// parseHTTPConf reads the http section of data, the policy file at path
// ("" when it is not to be named), whose policy p is; nil when the
// library refused the file: then the section is checked but for its
// rules, and a document the library could not read is left to its error,
// so that every problem of the file is reported at once. Every problem is
// reported as a *policy.Error, several joined, as the library
// reports the rest of the file's, e.g.
//
//	policy worker.yaml: line 3: http.allow_hosts[2]: "https://x.example.com" is a URL; give the host alone, ...
func parseHTTPConf(path string, data []byte, p *policy.Policy) (httpConf, error) {
	var errs []error
	add := func(fe *yamldoc.Problem) {
		errs = append(errs, &policy.Error{File: path, Line: fe.Line, Field: fe.Field, Msg: fe.Msg})
	}
	var b yamldoc.Block[httpDoc]
	if fe := yamldoc.DecodeSection(data, "http", &b); fe != nil {
		if p == nil {
			return httpConf{}, nil // the library's error says it
		}
		add(fe)
		return httpConf{}, errors.Join(errs...)
	}
	r := &yamldoc.Reader{}
	d := yamldoc.Open(r, "http", &b)
	if d == nil {
		if r.First != nil {
			add(r.First)
		}
		return httpConf{}, errors.Join(errs...)
	}
	var hc httpConf
	for i, s := range yamldoc.Entries(r, "http.allow_hosts", &d.AllowHosts, `a list of hosts such as [api.example.com, "*.example.net:443"]`) {
		f := fmt.Sprintf("http.allow_hosts[%d]", i+1)
		r := &yamldoc.Reader{}
		if h, ok := yamldoc.Get(r, f, s); !ok {
			r.Fail(f, d.AllowHosts.At[i], "must be a host such as api.example.com")
		} else if pt, err := egress.ParsePattern(h); err != nil {
			r.Fail(f, s.Line, "%v", err)
		} else {
			hc.allowHosts = append(hc.allowHosts, pt.String())
		}
		if r.First != nil {
			add(r.First)
		}
	}
	costs := map[string]bool{} // nil p: the rules are not checked
	for _, rule := range p.Rules() {
		costs[rule.Name] = rule.Cost != ""
	}
	at := map[string]int{} // rule → its entry
	for i := range yamldoc.Entries(r, "http.settle_headers", &d.SettleHeaders, "a list such as - {rule: vendor-points, header: X-Actual-Cost}") {
		f := fmt.Sprintf("http.settle_headers[%d]", i+1)
		e := &d.SettleHeaders.V[i]
		r := &yamldoc.Reader{}
		if sd := yamldoc.Must(r, f, d.SettleHeaders.At[i], e); sd != nil {
			rule, _ := yamldoc.Get(r, f+".rule", sd.Rule)
			header, _ := yamldoc.Get(r, f+".header", sd.Header)
			hasCost, known := costs[rule]
			switch {
			case r.First != nil:
			case rule == "":
				r.Fail(f+".rule", e.Line, "missing; an entry names the rule whose cost the header carries")
			case !known && p != nil:
				r.Fail(f+".rule", sd.Rule.Line, "no rule is named %q", rule)
			case !hasCost && p != nil:
				r.Fail(f+".rule", sd.Rule.Line, "rule %q has no cost to settle", rule)
			case at[rule] > 0:
				r.Fail(f+".rule", sd.Rule.Line, "rule %q already has its header, http.settle_headers[%d]", rule, at[rule])
			case !httpcall.IsToken(header):
				r.Fail(f+".header", max(sd.Header.Line, e.Line), "must be an HTTP header name such as X-Actual-Cost, got %q", header)
			default:
				at[rule] = i + 1
				if hc.settle == nil {
					hc.settle = map[string]string{}
				}
				hc.settle[rule] = header
			}
		}
		if r.First != nil {
			add(r.First)
		}
	}
	if r.First != nil {
		add(r.First)
	}
	return hc, errors.Join(errs...)
}
