package taskrl

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"
)

// A policy file is decoded by goccy/go-yaml, strictly (unknown fields are
// refused), into the tagged structs of policyfile.go, whose fields are the
// wrappers below: scalar, block and list. They never fail the decoding on
// a wrong value: each keeps its line and what is wrong with it, so that the
// reading that follows (reader) can name the rule and the field, report
// every wrong rule and not only the first, and say what was expected in
// the policy's own words.

// ferr is a problem at one YAML node, relative to the rule (or document)
// being read.
type ferr struct {
	field string
	line  int
	msg   string
}

func lineOf(n ast.Node) int {
	if m, ok := n.(*ast.MappingNode); ok && !m.IsFlowStyle && len(m.Values) > 0 {
		n = m.Values[0].Key
	}
	if n == nil || reflect.ValueOf(n).IsNil() {
		return 0
	}
	if tk := n.GetToken(); tk != nil && tk.Position != nil {
		return tk.Position.Line
	}
	return 0
}

func join(field, key string) string {
	switch {
	case field == "":
		return key
	case key == "":
		return field
	}
	return field + "." + key
}

// tokText returns the source text of n's token, or "".
func tokText(n ast.Node) string {
	if n == nil || reflect.ValueOf(n).IsNil() {
		return ""
	}
	if tk := n.GetToken(); tk != nil {
		return tk.Value
	}
	return ""
}

// kindOf names a node's kind for messages.
func kindOf(n ast.Node) string {
	switch v := n.(type) {
	case *ast.MappingNode:
		return "a mapping"
	case *ast.SequenceNode:
		return "a list"
	case *ast.StringNode:
		return fmt.Sprintf("the string %q", v.Value)
	case *ast.LiteralNode:
		return "a block string"
	case *ast.IntegerNode:
		return "the integer " + tokText(v)
	case *ast.FloatNode, *ast.InfinityNode, *ast.NanNode:
		return "the number " + tokText(n)
	case *ast.BoolNode:
		return "the boolean " + tokText(v)
	case *ast.NullNode:
		return "null (an empty value)"
	}
	return n.Type().String()
}

func orList(s []string) string {
	switch len(s) {
	case 1:
		return s[0]
	case 2:
		return s[0] + " or " + s[1]
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// decodeDoc parses data as one YAML document and decodes it into v, a
// pointer to a block; want says what an empty document lacks.
func decodeDoc(data []byte, want string, v any) *ferr {
	f, fe := parseYAML(data)
	if fe != nil {
		return fe
	}
	var docs []*ast.DocumentNode
	for _, doc := range f.Docs {
		if doc != nil && doc.Body != nil {
			docs = append(docs, doc)
		}
	}
	switch {
	case len(docs) == 0:
		return &ferr{msg: "the document is empty; " + want}
	case len(docs) > 1:
		return &ferr{line: lineOf(docs[1]), msg: "more than one YAML document; want one"}
	}
	body := docs[0].Body
	c := &refCheck{defined: map[string]bool{}}
	ast.Walk(refVisitor{c: c}, body)
	if c.fe != nil {
		return c.fe
	}
	return decodeNode(body, v)
}

// parseYAML parses data, turning the parser's errors (and, defensively,
// its panics) into a ferr.
func parseYAML(data []byte) (f *ast.File, fe *ferr) {
	defer func() {
		if r := recover(); r != nil {
			f, fe = nil, &ferr{msg: fmt.Sprintf("YAML: cannot parse the document: %v", r)}
		}
	}()
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		return nil, yamlError(err)
	}
	return f, nil
}

// decodeNode decodes body into v with a strict decoder (the parser has
// refused duplicate keys; those merged in may be overridden), turning its errors
// (and, defensively, its panics) into a ferr.
func decodeNode(body ast.Node, v any) (fe *ferr) {
	defer func() {
		if r := recover(); r != nil {
			fe = &ferr{msg: fmt.Sprintf("YAML: cannot decode the document: %v", r)}
		}
	}()
	if err := yaml.NewDecoder(strings.NewReader(""), yaml.DisallowUnknownField(), yaml.AllowDuplicateMapKey()).DecodeFromNode(body, v); err != nil {
		return yamlError(err)
	}
	return nil
}

// yamlError turns an error of goccy/go-yaml into a ferr at its line.
func yamlError(err error) *ferr {
	fe := &ferr{msg: "YAML: " + err.Error()}
	var ye yaml.Error
	if errors.As(err, &ye) {
		fe.msg = "YAML: " + ye.GetMessage()
		if tk := ye.GetToken(); tk != nil && tk.Position != nil {
			fe.line = tk.Position.Line
		}
	}
	return fe
}

// refCheck checks a document's anchors and aliases before it is decoded:
// an alias must refer to an anchor defined before it and not around it,
// and anchors have distinct names.
type refCheck struct {
	defined map[string]bool
	fe      *ferr
}

// refVisitor walks a document for refCheck; inside lists the anchors
// around the nodes it visits.
type refVisitor struct {
	c      *refCheck
	inside []string
}

func (v refVisitor) Visit(n ast.Node) ast.Visitor {
	if v.c.fe != nil {
		return nil
	}
	switch n := n.(type) {
	case *ast.AnchorNode:
		name := tokText(n.Name)
		if v.c.defined[name] {
			v.c.fe = &ferr{line: lineOf(n), msg: fmt.Sprintf("anchor &%s is defined twice; give each anchor its own name", name)}
			return nil
		}
		v.c.defined[name] = true
		return refVisitor{c: v.c, inside: append(v.inside[:len(v.inside):len(v.inside)], name)}
	case *ast.AliasNode:
		name := tokText(n.Value)
		switch {
		case !v.c.defined[name]:
			v.c.fe = &ferr{line: lineOf(n), msg: fmt.Sprintf("alias *%s refers to no anchor defined before it", name)}
		case slices.Contains(v.inside, name):
			v.c.fe = &ferr{line: lineOf(n), msg: fmt.Sprintf("alias *%s is inside the value it refers to", name)}
		}
		return nil
	}
	return v
}

// valueOf returns the node the decoder is decoding, resolved (anchors and
// aliases followed), through an InterfaceUnmarshaler's decode function.
func valueOf(decode func(any) error) (ast.Node, error) {
	var n ast.Node
	if err := decode(&n); err != nil {
		return nil, err
	}
	return n, nil
}

// refused says what is wrong with a node no field accepts whatever its
// type: a YAML tag; "" when nothing is.
func refused(n ast.Node) string {
	if _, ok := n.(*ast.TagNode); ok {
		return fmt.Sprintf("YAML tags (%s) are not supported", tokText(n))
	}
	return ""
}

// The scalar values of a policy file that have a syntax of their own.
type (
	share    float64 // a share: 0.1 or "10%"
	factor   float64 // borrow: true, false, a factor such as 2x, or a number
	costText string  // a cost: a template or a whole number, kept as text
	keyText  string  // a key: a string, or a number or boolean as written
)

// valType is the types a val holds.
type valType interface {
	string | float64 | int | time.Duration | share | factor | costText | keyText
}

// val is a scalar field of a policy file. Null reads as absent.
type val[T valType] struct {
	v    T
	set  bool   // given, and not null
	line int    // of the value
	bad  string // what is wrong with it; "" when nothing is
}

// UnmarshalYAML reads the value, keeping what is wrong with it in s.bad.
func (s *val[T]) UnmarshalYAML(decode func(any) error) error {
	n, err := valueOf(decode)
	if err != nil {
		return err
	}
	s.set, s.line = true, lineOf(n)
	if s.bad = refused(n); s.bad != "" {
		return nil
	}
	if _, ok := n.(*ast.NullNode); ok {
		s.set = false
		return nil
	}
	switch p := any(&s.v).(type) {
	case *string:
		*p, s.bad = str(n)
	case *float64:
		*p, s.bad = number(n)
	case *int:
		*p, s.bad = integer(n)
	case *time.Duration:
		*p, s.bad = duration(n)
	case *share:
		*p, s.bad = shareOf(n)
	case *factor:
		*p, s.bad = factorOf(n)
	case *costText:
		*p, s.bad = costOf(n)
	case *keyText:
		*p, s.bad = keyOf(n)
	}
	return nil
}

func str(n ast.Node) (string, string) {
	switch v := n.(type) {
	case *ast.StringNode:
		return v.Value, ""
	case *ast.LiteralNode:
		return v.Value.Value, ""
	case *ast.MappingNode, *ast.SequenceNode:
		return "", "must be a string, got " + kindOf(n)
	}
	return "", fmt.Sprintf("must be a string, got %s (quote it)", kindOf(n))
}

func number(n ast.Node) (float64, string) {
	switch v := n.(type) {
	case *ast.IntegerNode:
		switch x := v.Value.(type) {
		case int64:
			return float64(x), ""
		case uint64:
			return float64(x), ""
		}
	case *ast.FloatNode:
		return v.Value, ""
	case *ast.InfinityNode, *ast.NanNode:
		return 0, "must be a finite number, got " + tokText(n)
	case *ast.StringNode:
		// The parser reads integers too large for int64 as plain strings.
		if tk := v.GetToken(); tk != nil && tk.Type == token.StringType {
			if f, err := strconv.ParseFloat(v.Value, 64); err == nil {
				return f, ""
			}
		}
	}
	return 0, "must be a number, got " + kindOf(n)
}

// maxInt bounds whole numbers: Redis scripts compute in doubles.
const maxInt = 1 << 53

func integer(n ast.Node) (int, string) {
	f, bad := number(n)
	switch {
	case bad != "":
		return 0, bad
	case f > maxInt || f < -maxInt:
		return 0, fmt.Sprintf("out of range (at most %d in magnitude), got %s", int64(maxInt), tokText(n))
	case f != float64(int64(f)):
		return 0, "must be a whole number, got " + tokText(n)
	}
	return int(f), ""
}

func duration(n ast.Node) (time.Duration, string) {
	var s string
	switch v := n.(type) {
	case *ast.IntegerNode, *ast.FloatNode:
		return 0, fmt.Sprintf("%s needs a unit, e.g. %ss (Go duration syntax: ms, s, m, h)", tokText(n), tokText(n))
	case *ast.StringNode:
		s = strings.TrimSpace(v.Value)
	default:
		return 0, "must be a duration such as 1s, 10m or 24h, got " + kindOf(n)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
			return 0, fmt.Sprintf("%q needs a unit, e.g. %ss (Go duration syntax: ms, s, m, h)", n.(*ast.StringNode).Value, s)
		}
		return 0, fmt.Sprintf("%q is not a duration; use Go syntax such as 500ms, 1s, 10m or 24h", n.(*ast.StringNode).Value)
	}
	return d, ""
}

// shareOf reads a share: a number (0.1) or a percentage ("10%").
func shareOf(n ast.Node) (share, string) {
	if sn, ok := n.(*ast.StringNode); ok && strings.HasSuffix(sn.Value, "%") {
		f, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(sn.Value, "%")), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, fmt.Sprintf("must be a share like 10%% or 0.1, got %q", sn.Value)
		}
		return share(f / 100), ""
	}
	f, bad := number(n)
	return share(f), bad
}

// factorOf reads a rule's borrow: true (up to the shared rule's rate),
// false, or a factor such as 2x (or 2).
func factorOf(n ast.Node) (factor, string) {
	switch v := n.(type) {
	case *ast.BoolNode:
		if v.Value {
			return factor(math.Inf(1)), ""
		}
		return 0, ""
	case *ast.StringNode:
		if f, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(v.Value, "x")), 64); err == nil && strings.HasSuffix(v.Value, "x") && !math.IsNaN(f) && !math.IsInf(f, 0) {
			return factor(f), ""
		}
		return 0, fmt.Sprintf("must be true, false or a factor like 2x, got %q", v.Value)
	}
	f, bad := number(n)
	return factor(f), bad
}

// costOf reads a rule's cost: a template string ("{{.units}}") or a whole
// number (3), kept as text.
func costOf(n ast.Node) (costText, string) {
	if _, ok := n.(*ast.IntegerNode); ok {
		i, bad := integer(n)
		return costText(strconv.Itoa(i)), bad
	}
	s, bad := str(n)
	return costText(s), bad
}

// keyOf reads a key: a string, or a number or boolean as written (key: 42
// is the key "42", as the template renders the number 42).
func keyOf(n ast.Node) (keyText, string) {
	switch n.(type) {
	case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode:
		return keyText(tokText(n)), ""
	}
	s, bad := str(n)
	return keyText(s), bad
}

// block is a mapping field of a policy file, decoded into T, a struct
// whose fields carry yaml tags. Null reads as absent.
type block[T any] struct {
	v    T
	set  bool           // given, and not null
	line int            // of the mapping (its first key, for a block mapping)
	keys map[string]int // the line of each key written in it (not merged)
	bad  *ferr          // what is wrong, field relative to the block; nil when nothing is
}

// UnmarshalYAML checks that the value is a mapping of T's fields and
// decodes it into b.v, keeping what is wrong in b.bad.
func (b *block[T]) UnmarshalYAML(decode func(any) error) error {
	n, err := valueOf(decode)
	if err != nil {
		return err
	}
	b.set, b.line = true, lineOf(n)
	if msg := refused(n); msg != "" {
		b.bad = &ferr{line: b.line, msg: msg}
		return nil
	}
	m, ok := n.(*ast.MappingNode)
	if !ok {
		if _, null := n.(*ast.NullNode); null {
			b.set = false
			return nil
		}
		b.bad = &ferr{line: b.line, msg: "must be a mapping, got " + kindOf(n)}
		return nil
	}
	// Keys written in the mapping override those merged into it (<<),
	// wherever the merge key is: the decoder takes the last.
	slices.SortStableFunc(m.Values, func(x, y *ast.MappingValueNode) int {
		return cmp.Compare(mergeFirst(x), mergeFirst(y))
	})
	// Decode first, so that what can be read is read (a rule's name, for
	// its errors) even when a key is unknown.
	err = decode(&b.v)
	names := fieldNames(reflect.TypeFor[T]())
	b.keys = map[string]int{}
	for _, mv := range m.Values {
		if mv.Key.IsMergeKey() {
			continue
		}
		k, ok := mv.Key.(*ast.StringNode)
		if !ok {
			b.bad = &ferr{line: lineOf(mv.Key), msg: "keys must be field names, got " + kindOf(mv.Key)}
			return nil
		}
		if !slices.Contains(names, k.Value) {
			b.bad = unknownField(k.Value, lineOf(k), names)
			return nil
		}
		b.keys[k.Value] = lineOf(k)
	}
	if err != nil {
		b.bad = yamlError(err)
		var ye yaml.Error
		if errors.As(err, &ye) && strings.HasPrefix(ye.GetMessage(), "unknown field") && ye.GetToken() != nil {
			// A key merged in (<<) that T lacks.
			b.bad = unknownField(ye.GetToken().Value, b.bad.line, names)
		}
	}
	return nil
}

func mergeFirst(mv *ast.MappingValueNode) int {
	if mv.Key.IsMergeKey() {
		return 0
	}
	return 1
}

func unknownField(key string, line int, expected []string) *ferr {
	return &ferr{field: key, line: line, msg: "unknown field; expected " + orList(expected)}
}

// fieldNames returns the yaml names of struct type t's fields in order,
// those of inlined structs in place.
func fieldNames(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		name, opt, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if opt == "inline" {
			out = append(out, fieldNames(t.Field(i).Type)...)
		} else if name != "" {
			out = append(out, name)
		}
	}
	return out
}

// list is a list field of a policy file whose entries decode into T (a
// scalar or block). Null reads as absent.
type list[T any] struct {
	v     []T
	set   bool   // given, and not null
	line  int    // of the list
	lines []int  // of each entry
	got   string // what the value is when it is not a list; "" when it is
	bad   string // what else is wrong; "" when nothing is
}

// UnmarshalYAML checks that the value is a list and decodes its entries.
func (l *list[T]) UnmarshalYAML(decode func(any) error) error {
	n, err := valueOf(decode)
	if err != nil {
		return err
	}
	l.set, l.line = true, lineOf(n)
	if l.bad = refused(n); l.bad != "" {
		return nil
	}
	seq, ok := n.(*ast.SequenceNode)
	if !ok {
		if _, null := n.(*ast.NullNode); null {
			l.set = false
			return nil
		}
		l.got = kindOf(n)
		return nil
	}
	for _, v := range seq.Values {
		l.lines = append(l.lines, lineOf(v))
	}
	if err := decode(&l.v); err != nil {
		l.bad = yamlError(err).msg
	}
	return nil
}

// reader reads decoded fields, keeping the first problem met and the line
// of every field read.
type reader struct {
	fe *ferr
	ls lines
}

// fail records a problem unless one is already.
func (r *reader) fail(field string, line int, format string, args ...any) {
	if r.fe == nil {
		r.fe = &ferr{field: field, line: line, msg: fmt.Sprintf(format, args...)}
	}
}

// at records the lines of the keys written in b, under field.
func (r *reader) at(field string, keys map[string]int) {
	for k, line := range keys {
		if _, ok := r.ls[join(field, k)]; !ok {
			r.ls[join(field, k)] = line
		}
	}
}

// get returns the value of s, field, and whether it was given and valid.
func get[T valType](r *reader, field string, s val[T]) (T, bool) {
	if s.line > 0 {
		if _, ok := r.ls[field]; !ok {
			r.ls[field] = s.line
		}
	}
	if s.bad != "" {
		r.fail(field, s.line, "%s", s.bad)
		return s.v, false
	}
	return s.v, s.set
}

// open returns the fields of b, field, or nil when it was not given or is
// wrong.
func open[T any](r *reader, field string, b *block[T]) *T {
	if !b.set {
		return nil
	}
	if _, ok := r.ls[field]; !ok {
		r.ls[field] = b.line
	}
	if b.bad != nil {
		r.fail(join(field, b.bad.field), b.bad.line, "%s", b.bad.msg)
		return nil
	}
	return &b.v
}

// entries returns the entries of l, field, or nil when it was not given or
// is wrong; want describes a valid value, e.g. "a list of rules".
func entries[T any](r *reader, field string, l *list[T], want string) []T {
	switch {
	case l.bad != "":
		r.fail(field, l.line, "%s", l.bad)
		return nil
	case l.got != "":
		r.fail(field, l.line, "must be %s, got %s", want, l.got)
		return nil
	}
	return l.v
}
