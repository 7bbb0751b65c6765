// Package campaign enqueues fan-out campaigns: N tasks of one type on one
// queue, either at once (the enqueue binary's bulk mode) or on a cron
// schedule, where an asynq Scheduler enqueues one fan-out task per tick
// (TypeFanout) and a worker running NewFanoutHandler turns it into the N
// tasks, exactly once per tick however many schedulers run.
//
// A Spec describes the campaign; Enqueue is the bounded-parallel enqueue loop
// both modes share; Schedule parses the campaign's cron spec and names the
// tick a fan-out belongs to; RunScheduler runs the scheduler side.
//
// # Exactly once per tick
//
// Every scheduler process registers the same fan-out task (same payload), with
// asynq.Unique for less than the cron period, so two schedulers usually
// enqueue one fan-out per tick. What makes it exact is the claim: the handler
// names the tick the fan-out belongs to (the latest tick at or before the
// Redis server's TIME, recorded per fan-out task ID so that a retry finds the
// same tick) and claims it with SET NX on
//
//	PREFIX "campaign:{" NAME "}:" TICK_UNIX
//
// holding the fan-out's task ID. A fan-out that finds another ID there does
// nothing; one that finds its own ID is a retry and carries on. The tasks get
// deterministic IDs NAME ":" TICK_UNIX ":" I, kept by asynq for
// FanoutRetention after they complete, and the handler checkpoints its
// progress every DefaultChunk tasks, so a retry after a crash resumes where
// the previous attempt stopped without enqueueing a task twice: a task of the
// last chunk that already ran still holds its ID. (A retry more than
// FanoutRetention after the crash may repeat up to a chunk of tasks.)
//
// Application code of the binaries, imported by cmd/enqueue and cmd/worker.
package campaign

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/keys"
)

// TypeFanout is the asynq task type of a campaign's fan-out task: its payload
// is a JSON Spec, and NewFanoutHandler processes it.
const TypeFanout = "taskrl:fanout"

// DefaultPrefix starts every Redis key the campaign code writes when
// Spec.Prefix is empty, the same default as the limiters'.
const DefaultPrefix = "taskrl:"

// DefaultType is the task type of a Spec whose Type is empty: the worker's
// built-in HTTP call.
const DefaultType = "http:call"

// maxName is the longest campaign name.
const maxName = 64

// Spec describes a campaign: which tasks to enqueue and, for a recurring
// campaign, when. Its JSON form is the payload of the fan-out task. A Spec is
// a plain value; it is safe for concurrent use once no longer modified.
type Spec struct {
	// Name identifies a recurring campaign: its keys and its tasks' IDs.
	// 1-64 characters from [A-Za-z0-9._-]. Required for a fan-out;
	// DefaultName derives one from the rest of the Spec.
	Name string `json:"name,omitempty"`
	// Type is the task type. Default DefaultType ("http:call").
	Type string `json:"type"`
	// Queue is the asynq queue of the tasks (and of the fan-out task).
	// Default "default".
	Queue string `json:"queue"`
	// MaxRetry, when not nil, is asynq's MaxRetry for each task (0 is
	// legal); nil means asynq's default (25).
	MaxRetry *int `json:"max_retry,omitempty"`

	// URL, Count and Businesses generate Count payloads
	// {"url": URL, "method": "POST", "business_id": "b<i%Businesses+1>"}.
	// Businesses defaults to 1. Exclusive with Payloads.
	URL        string `json:"url,omitempty"`
	Count      int    `json:"count,omitempty"`
	Businesses int    `json:"businesses,omitempty"`
	// Payloads, when set, are the tasks' payloads, one JSON object each.
	Payloads []json.RawMessage `json:"payloads,omitempty"`

	// Cron is the schedule of a recurring campaign: a 5-field cron spec,
	// a descriptor such as "@weekly", or "@every DURATION" (see
	// ParseSchedule). "" for a one-off campaign.
	Cron string `json:"cron,omitempty"`
	// TZ is the IANA time zone of Cron. "" means UTC.
	TZ string `json:"tz,omitempty"`
	// Prefix starts the Redis keys of the fan-out's claims. "" means
	// DefaultPrefix.
	Prefix string `json:"prefix,omitempty"`
}

// withDefaults returns s with its defaults filled in.
func (s Spec) withDefaults() Spec {
	if s.Type == "" {
		s.Type = DefaultType
	}
	if s.Queue == "" {
		s.Queue = "default"
	}
	if s.Payloads == nil && s.Businesses == 0 {
		s.Businesses = 1
	}
	if s.Prefix == "" {
		s.Prefix = DefaultPrefix
	}
	if s.TZ == "UTC" {
		s.TZ = ""
	}
	return s
}

// Normalize returns s with every default filled in and each payload
// compacted, as Validate, Len and Payload see it.
func (s Spec) Normalize() Spec {
	s = s.withDefaults()
	if s.Payloads != nil {
		ps := make([]json.RawMessage, len(s.Payloads))
		for i, p := range s.Payloads {
			var b bytes.Buffer
			if json.Compact(&b, p) == nil {
				p = b.Bytes()
			}
			ps[i] = p
		}
		s.Payloads = ps
	}
	return s
}

// Validate reports what is wrong with s (after defaults), or nil. Errors name
// the field, e.g. `count: must be at least 1, got 0`.
func (s Spec) Validate() error {
	s = s.withDefaults()
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if s.Name != "" {
		if err := ValidateName(s.Name); err != nil {
			errs = append(errs, err)
		}
	}
	if strings.TrimSpace(s.Type) == "" {
		bad("type", "must not be blank")
	} else if s.Type == TypeFanout {
		bad("type", "%q is the fan-out task itself; pick the type of the tasks to fan out", TypeFanout)
	}
	if strings.TrimSpace(s.Queue) == "" {
		bad("queue", "must not be blank")
	}
	if s.MaxRetry != nil && *s.MaxRetry < 0 {
		bad("max_retry", "must not be negative, got %d", *s.MaxRetry)
	}
	switch {
	case s.Payloads != nil:
		if s.Count != 0 || s.URL != "" || s.Businesses != 0 {
			bad("payloads", "exclusive with count, url and businesses")
		}
		if len(s.Payloads) == 0 {
			bad("payloads", "no payloads")
		}
		for i, p := range s.Payloads {
			if err := CheckPayload(p); err != nil {
				bad("payloads", "payload %d: %v", i+1, err)
				break
			}
		}
	default:
		if s.Count < 1 {
			bad("count", "must be at least 1, got %d", s.Count)
		}
		if s.Businesses < 1 {
			bad("businesses", "must be at least 1, got %d", s.Businesses)
		}
		if err := CheckURL(s.URL); err != nil {
			bad("url", "%v", err)
		}
	}
	if s.Cron != "" {
		if _, err := ParseSchedule(s.Cron, s.TZ); err != nil {
			bad("cron", "%v", err)
		}
	} else if s.TZ != "" {
		bad("tz", "set without cron")
	}
	if err := keys.ValidatePrefix(s.Prefix); err != nil {
		bad("prefix", "%v", err)
	}
	return errors.Join(errs...)
}

// ValidateName reports whether name can name a campaign: 1-64 characters
// from [A-Za-z0-9._-], so that it reads back unchanged in keys and task IDs.
func ValidateName(name string) error {
	if name == "" || len(name) > maxName {
		return fmt.Errorf("campaign name: must be 1-%d characters, got %d", maxName, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("campaign name %q: character %q not allowed; use A-Z, a-z, 0-9, '.', '_' and '-'", name, c)
		}
	}
	return nil
}

// CheckURL reports why u cannot be the URL of an http:call task: it must be
// an absolute http or https URL with a host.
func CheckURL(u string) error {
	if u == "" {
		return errors.New("required")
	}
	p, err := url.Parse(u)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %v", u, err)
	}
	if p.Scheme != "http" && p.Scheme != "https" || p.Host == "" {
		return fmt.Errorf("%q is not an absolute http or https URL", u)
	}
	return nil
}

// CheckPayload reports why p is not a JSON object.
func CheckPayload(p []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(p, &m); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("not a JSON object (found a JSON %s)", te.Value)
		}
		return fmt.Errorf("not valid JSON: %v", err)
	}
	if m == nil {
		return errors.New("not a JSON object (found null)")
	}
	return nil
}

// Len returns the number of tasks the campaign enqueues.
func (s Spec) Len() int {
	if s.Payloads != nil {
		return len(s.Payloads)
	}
	return s.Count
}

// Payload returns the payload of task i, 0 <= i < Len(). For a generated
// campaign it is {"url": URL, "method": "POST", "business_id": "bK"} with
// K = i%Businesses + 1.
func (s Spec) Payload(i int) []byte {
	if s.Payloads != nil {
		return s.Payloads[i]
	}
	k := s.Businesses
	if k < 1 {
		k = 1
	}
	var u bytes.Buffer
	enc := json.NewEncoder(&u)
	enc.SetEscapeHTML(false) // "&" stays "&" in URLs
	enc.Encode(s.URL)
	b := make([]byte, 0, u.Len()+64)
	b = append(b, `{"url":`...)
	b = append(b, bytes.TrimSuffix(u.Bytes(), []byte("\n"))...)
	b = append(b, `,"method":"POST","business_id":"b`...)
	b = strconv.AppendInt(b, int64(i%k+1), 10)
	return append(b, `"}`...)
}

// Options returns the asynq options every task of the campaign gets: its
// queue and, when set, its MaxRetry.
func (s Spec) Options() []asynq.Option {
	s = s.withDefaults()
	opts := []asynq.Option{asynq.Queue(s.Queue)}
	if s.MaxRetry != nil {
		opts = append(opts, asynq.MaxRetry(*s.MaxRetry))
	}
	return opts
}

// DefaultName derives a campaign name from everything in s but its Name:
// "c-" and 16 hex digits of a SHA-256, so that processes started with the
// same arguments run the same campaign and different campaigns differ.
func (s Spec) DefaultName() string {
	s = s.Normalize()
	s.Name = ""
	b, _ := json.Marshal(s)
	sum := sha256.Sum256(b)
	return "c-" + hex.EncodeToString(sum[:8])
}
