package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// keyTemplate is a parsed key template: literal text and field references.
type keyTemplate struct {
	parts  []tmplPart
	fields bool // some part is a field reference
}

type tmplPart struct {
	lit   string
	path  []string // field reference when non-nil
	field string   // path joined with '.'
}

// parseKeyTemplate parses the subset of text/template syntax allowed in
// keys: literal text and {{.field}} / {{.a.b}} references.
func parseKeyTemplate(s string) (*keyTemplate, error) {
	t := &keyTemplate{}
	rest := s
	for rest != "" {
		open := strings.Index(rest, "{{")
		if cl := strings.Index(rest, "}}"); cl >= 0 && (open < 0 || cl < open) {
			return nil, fmt.Errorf(`%q: "}}" without "{{"`, s)
		}
		if open < 0 {
			t.parts = append(t.parts, tmplPart{lit: rest})
			break
		}
		if open > 0 {
			t.parts = append(t.parts, tmplPart{lit: rest[:open]})
		}
		rest = rest[open+2:]
		end := strings.Index(rest, "}}")
		if end < 0 {
			return nil, fmt.Errorf(`%q: unclosed "{{"`, s)
		}
		action := rest[:end]
		rest = rest[end+2:]
		p, err := parseFieldRef(action)
		if err != nil {
			if "{{"+action+"}}" == s {
				return nil, fmt.Errorf("%q: %v", s, err)
			}
			return nil, fmt.Errorf("%q: %q: %v", s, "{{"+action+"}}", err)
		}
		t.parts = append(t.parts, tmplPart{path: p, field: strings.Join(p, ".")})
		t.fields = true
	}
	return t, nil
}

const onlyFields = "only field references such as {{.business_id}} or {{.account.id}} are allowed"

func parseFieldRef(action string) ([]string, error) {
	if strings.HasPrefix(action, "-") || strings.HasSuffix(action, "-") {
		return nil, errors.New("trim markers are not allowed; " + onlyFields)
	}
	a := strings.Trim(action, " ")
	switch {
	case a == "":
		return nil, errors.New("empty action; " + onlyFields)
	case a == ".":
		return nil, errors.New("the whole payload cannot be a key; " + onlyFields)
	case a[0] != '.':
		return nil, errors.New(onlyFields)
	}
	segs := strings.Split(a[1:], ".")
	for _, seg := range segs {
		if !isIdent(seg) {
			return nil, errors.New(onlyFields)
		}
	}
	return segs, nil
}

// isIdent reports whether s is a text/template field name: a letter or '_'
// followed by letters, digits and '_'.
func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		switch {
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		case i > 0 && c >= '0' && c <= '9':
		default:
			return false
		}
	}
	return true
}

// render renders t over a payload object. A missing field is reported as a
// *MissingFieldError without its Rule.
func (t *keyTemplate) render(obj map[string]json.RawMessage) (string, error) {
	var sb strings.Builder
	for _, p := range t.parts {
		if p.path == nil {
			sb.WriteString(p.lit)
			continue
		}
		v, err := lookup(obj, p)
		if err != nil {
			return "", err
		}
		sb.WriteString(v)
	}
	return sb.String(), nil
}

func lookup(obj map[string]json.RawMessage, p tmplPart) (string, error) {
	for i, name := range p.path {
		raw, ok := obj[name]
		if !ok {
			return "", &MissingFieldError{Field: p.field}
		}
		raw = bytes.TrimSpace(raw)
		if i == len(p.path)-1 {
			return scalar(raw, p.field)
		}
		sub := strings.Join(p.path[:i+1], ".")
		if len(raw) == 0 || raw[0] != '{' {
			return "", fmt.Errorf("payload field %q is %s, not an object, so %q cannot be read", sub, jsonKind(raw), p.field)
		}
		obj = nil
		if err := json.Unmarshal(raw, &obj); err != nil {
			return "", fmt.Errorf("payload field %q: %v", sub, err)
		}
	}
	return "", &MissingFieldError{Field: p.field} // unreachable: paths are non-empty
}

// scalar renders one JSON value as key text.
func scalar(raw json.RawMessage, field string) (string, error) {
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("payload field %q: %v", field, err)
		}
		return s, nil
	case 't', 'f', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return string(raw), nil // validated by the decoder: exact JSON text
	}
	return "", fmt.Errorf("payload field %q is %s; a key needs a string, number or boolean", field, jsonKind(raw))
}
