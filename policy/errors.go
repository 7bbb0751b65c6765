package policy

import (
	"errors"
	"strconv"
	"strings"
)

// Error is one thing wrong with a policy. Errors from New,
// Parse and LoadFile are a *Error or, when several rules
// are wrong, an errors.Join of them (one per line; errors.As finds the
// first).
type Error struct {
	// File is the policy file's path; "" unless from LoadFile.
	File string
	// Line is the 1-based line in the YAML document; 0 when unknown
	// (New, or an error about the whole document).
	Line int
	// Rule is the rule's name; "" when the rule has no valid name or the
	// error is not about one rule.
	Rule string
	// Index is the rule's 1-based position in the policy; 0 when the error
	// is not about one rule.
	Index int
	// Field is the YAML path of the field at fault, e.g. "gcra.rate",
	// "match.type", "redis_unavailable"; "" when the error is about the
	// rule or document as a whole.
	Field string
	// Msg says what is wrong.
	Msg string
}

// Error returns e.g.
// `policy: line 7: rule "per-business": gcra.rate: must be a positive number, got -1`.
func (e *Error) Error() string {
	var sb strings.Builder
	sb.WriteString("policy")
	if e.File != "" {
		sb.WriteString(" " + e.File)
	}
	sb.WriteString(": ")
	if e.Line > 0 {
		sb.WriteString("line " + strconv.Itoa(e.Line) + ": ")
	}
	switch {
	case e.Rule != "":
		sb.WriteString("rule " + strconv.Quote(e.Rule) + ": ")
	case e.Index > 0:
		sb.WriteString("rule " + strconv.Itoa(e.Index) + ": ")
	}
	if e.Field != "" {
		sb.WriteString(e.Field + ": ")
	}
	sb.WriteString(e.Msg)
	return sb.String()
}

// maxErrors bounds how many problems one error reports.
const maxErrors = 20

// errList collects policy errors.
type errList []*Error

func (l *errList) add(e *Error) {
	if len(*l) < maxErrors {
		*l = append(*l, e)
	}
}

func (l errList) err() error {
	switch len(l) {
	case 0:
		return nil
	case 1:
		return l[0]
	}
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errors.Join(errs...)
}
