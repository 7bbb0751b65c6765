// Package yamldoc decodes YAML configuration documents (taskrl's policy
// files, the worker's sections of them) strictly into tagged structs while
// keeping, for every value, its line and what is wrong with it, so that a
// document is refused with messages that name the line, the field and
// what is wrong in the document's own words.
//
// The structs' fields are the wrappers Val (a scalar: its Go type gives
// the syntax), Block (a mapping, decoded into a struct of wrappers) and
// List. Decoding never fails on a wrong value: each wrapper keeps the
// problem, and a Reader then reads the decoded fields in the order it
// chooses, keeping the first problem and the line of every field read.
// goccy/go-yaml resolves anchors, aliases and merge keys; Decode refuses
// unknown fields (yaml.DisallowUnknownField), tags, and aliases to no
// anchor defined before them or to the value they are in.
//
// Nothing here is safe for concurrent use; each document is decoded by
// one goroutine.
package yamldoc

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"
)

// Problem is what is wrong at one place of a document.
type Problem struct {
	// Field is the path of the field at fault relative to what is read,
	// e.g. "gcra.rate" or "critical[1].type"; "" for the whole of it.
	Field string
	// Line is the 1-based line of the value at fault; 0 when unknown.
	Line int
	// Msg says what is wrong.
	Msg string
}

// lineOf is the line of n's token, or of its first key for a block
// mapping; 0 when unknown.
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

// Join returns the path of key under field, "gcra.rate"; either may be
// "".
func Join(field, key string) string {
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

// orList writes s as "a, b or c".
func orList(s []string) string {
	switch len(s) {
	case 1:
		return s[0]
	case 2:
		return s[0] + " or " + s[1]
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// Decode parses data as one YAML document and decodes it into v, a
// pointer to a Block, strictly; want says what an empty document lacks
// ("a policy needs a rules list"). The Problem, nil when the document
// could be decoded, is one that prevented decoding: syntax, several
// documents, anchors and aliases; the wrappers in v hold the others.
func Decode(data []byte, want string, v any) *Problem {
	return decode(data, want, "", v)
}

// decode is Decode, or DecodeSection for a name.
func decode(data []byte, want, name string, v any) *Problem {
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
		return &Problem{Msg: "the document is empty; " + want}
	case len(docs) > 1:
		return &Problem{Line: lineOf(docs[1]), Msg: "more than one YAML document; want one"}
	}
	body := docs[0].Body
	c := &refCheck{defined: map[string]bool{}}
	ast.Walk(refVisitor{c: c}, body)
	if c.fe != nil {
		return c.fe
	}
	return decodeNode(body, name, v)
}

// DecodeSection is Decode for the top-level key name of a document whose
// other keys another reader checks: it decodes only that key's value into
// v, and nothing when the document is not a mapping or lacks the key.
func DecodeSection(data []byte, name string, v any) *Problem {
	return decode(data, "", name, v)
}

// parseYAML parses data, turning the parser's errors (and, defensively,
// its panics) into a Problem.
func parseYAML(data []byte) (f *ast.File, fe *Problem) {
	defer func() {
		if r := recover(); r != nil {
			f, fe = nil, &Problem{Msg: fmt.Sprintf("YAML: cannot parse the document: %v", r)}
		}
	}()
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		return nil, yamlError(err)
	}
	return f, nil
}

// decodeNode decodes body, or the value of its key name when name is not
// "", into v with a strict decoder (the parser has refused duplicate keys;
// those merged in may be overridden), turning its errors (and,
// defensively, its panics) into a Problem.
func decodeNode(body ast.Node, name string, v any) (fe *Problem) {
	defer func() {
		if r := recover(); r != nil {
			fe = &Problem{Msg: fmt.Sprintf("YAML: cannot decode the document: %v", r)}
		}
	}()
	dec := yaml.NewDecoder(strings.NewReader(""), yaml.DisallowUnknownField(), yaml.AllowDuplicateMapKey())
	if name != "" {
		var m map[string]ast.Node
		if dec.DecodeFromNode(body, &m) != nil || m[name] == nil {
			return nil // not a mapping, or no such key: the other reader's
		}
		body = m[name]
	}
	if err := dec.DecodeFromNode(body, v); err != nil {
		return yamlError(err)
	}
	return nil
}

// yamlError turns an error of goccy/go-yaml into a Problem at its line.
func yamlError(err error) *Problem {
	fe := &Problem{Msg: "YAML: " + err.Error()}
	var ye yaml.Error
	if errors.As(err, &ye) {
		fe.Msg = "YAML: " + ye.GetMessage()
		if tk := ye.GetToken(); tk != nil && tk.Position != nil {
			fe.Line = tk.Position.Line
		}
	}
	return fe
}

// refCheck checks a document's anchors and aliases before it is decoded:
// an alias must refer to an anchor defined before it and not around it,
// and anchors have distinct names.
type refCheck struct {
	defined map[string]bool
	fe      *Problem
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
			v.c.fe = &Problem{Field: fieldOf(n), Line: lineOf(n), Msg: fmt.Sprintf("anchor &%s is defined twice; give each anchor its own name", name)}
			return nil
		}
		v.c.defined[name] = true
		return refVisitor{c: v.c, inside: append(v.inside[:len(v.inside):len(v.inside)], name)}
	case *ast.AliasNode:
		name := tokText(n.Value)
		switch {
		case !v.c.defined[name]:
			v.c.fe = &Problem{Field: fieldOf(n), Line: lineOf(n), Msg: fmt.Sprintf("alias *%s refers to no anchor defined before it", name)}
		case slices.Contains(v.inside, name):
			v.c.fe = &Problem{Field: fieldOf(n), Line: lineOf(n), Msg: fmt.Sprintf("alias *%s is inside the value it refers to", name)}
		}
		return nil
	}
	return v
}

// pathIndex is an index in a YAML path: [0].
var pathIndex = regexp.MustCompile(`\[\d+\]`)

// fieldOf names the field of n as a Problem does: the YAML path
// $.rules[0].match is rules[1].match.
func fieldOf(n ast.Node) string {
	path := strings.TrimPrefix(strings.TrimPrefix(n.GetPath(), "$"), ".")
	return pathIndex.ReplaceAllStringFunc(path, func(ix string) string {
		i, _ := strconv.Atoi(ix[1 : len(ix)-1])
		return "[" + strconv.Itoa(i+1) + "]"
	})
}

// ValueOf returns the node being decoded, resolved (anchors and aliases
// followed), through the decode function of an UnmarshalYAML method (the
// goccy/go-yaml InterfaceUnmarshaler's), for a wrapper of one's own.
func ValueOf(decode func(any) error) (ast.Node, error) {
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

// Scalars with a syntax of their own, for Val. A string is any string (not
// a number or boolean: "must be a string, got the integer 5 (quote it)"),
// a float64 any finite number, an int a whole number of magnitude at most
// 2^53, a time.Duration a Go duration with its unit ("500ms", not 500).
type (
	// Share is a number (0.1) or a percentage ("10%", 0.1).
	Share float64
	// Factor is true (+Inf), false (0), a factor such as "2x" (2), or a
	// number.
	Factor float64
	// IntText is a string, or a whole number kept as its decimal text.
	IntText string
	// ScalarText is a string, or a number or boolean as written (42 is
	// "42").
	ScalarText string
	// DurationOff is a duration, or off (or false): -1.
	DurationOff time.Duration
)

// ValType is the types a Val holds.
type ValType interface {
	string | float64 | int | bool | time.Duration | Share | Factor | IntText | ScalarText | DurationOff
}

// Val is a scalar field: a field of type Val[int] decodes a whole number.
// Null reads as absent. The zero Val is absent.
type Val[T ValType] struct {
	V    T      // the value; the zero T when absent or wrong
	Set  bool   // given, and not null
	Line int    // of the value; 0 when absent
	Bad  string // what is wrong with it; "" when nothing is
}

// UnmarshalYAML reads the value, keeping what is wrong with it in s.Bad.
func (s *Val[T]) UnmarshalYAML(decode func(any) error) error {
	n, err := ValueOf(decode)
	if err != nil {
		return err
	}
	s.Set, s.Line = true, lineOf(n)
	if s.Bad = refused(n); s.Bad != "" {
		return nil
	}
	if _, ok := n.(*ast.NullNode); ok {
		s.Set = false
		return nil
	}
	switch p := any(&s.V).(type) {
	case *string:
		*p, s.Bad = str(n)
	case *float64:
		*p, s.Bad = number(n)
	case *int:
		*p, s.Bad = integer(n)
	case *bool:
		*p, s.Bad = boolean(n)
	case *time.Duration:
		*p, s.Bad = duration(n)
	case *Share:
		*p, s.Bad = share(n)
	case *Factor:
		*p, s.Bad = factor(n)
	case *IntText:
		*p, s.Bad = intText(n)
	case *ScalarText:
		*p, s.Bad = scalarText(n)
	case *DurationOff:
		*p, s.Bad = durationOff(n)
	}
	return nil
}

func boolean(n ast.Node) (bool, string) {
	if v, ok := n.(*ast.BoolNode); ok {
		return v.Value, ""
	}
	return false, "must be true or false, got " + kindOf(n)
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

func durationOff(n ast.Node) (DurationOff, string) {
	switch v := n.(type) {
	case *ast.BoolNode:
		if !v.Value {
			return -1, ""
		}
	case *ast.StringNode:
		if strings.TrimSpace(v.Value) == "off" {
			return -1, ""
		}
	}
	d, bad := duration(n)
	if bad != "" {
		bad += " (or off)"
	}
	return DurationOff(d), bad
}

func share(n ast.Node) (Share, string) {
	if sn, ok := n.(*ast.StringNode); ok && strings.HasSuffix(sn.Value, "%") {
		f, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(sn.Value, "%")), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, fmt.Sprintf("must be a share like 10%% or 0.1, got %q", sn.Value)
		}
		return Share(f / 100), ""
	}
	f, bad := number(n)
	return Share(f), bad
}

func factor(n ast.Node) (Factor, string) {
	switch v := n.(type) {
	case *ast.BoolNode:
		if v.Value {
			return Factor(math.Inf(1)), ""
		}
		return 0, ""
	case *ast.StringNode:
		if f, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(v.Value, "x")), 64); err == nil && strings.HasSuffix(v.Value, "x") && !math.IsNaN(f) && !math.IsInf(f, 0) {
			return Factor(f), ""
		}
		return 0, fmt.Sprintf("must be true, false or a factor like 2x, got %q", v.Value)
	}
	f, bad := number(n)
	return Factor(f), bad
}

func intText(n ast.Node) (IntText, string) {
	switch n.(type) {
	case *ast.IntegerNode:
		i, bad := integer(n)
		return IntText(strconv.Itoa(i)), bad
	case *ast.FloatNode, *ast.InfinityNode, *ast.NanNode:
		return "", "must be a whole number or a template of one, got " + tokText(n)
	}
	s, bad := str(n)
	return IntText(s), bad
}

func scalarText(n ast.Node) (ScalarText, string) {
	switch n.(type) {
	case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode:
		return ScalarText(tokText(n)), ""
	}
	s, bad := str(n)
	return ScalarText(s), bad
}

// Block is a mapping field, decoded into T, a struct whose fields are
// wrappers (Val, Block, List, or types of one's own with an UnmarshalYAML
// of the InterfaceUnmarshaler kind) tagged with their yaml names
// (`yaml:"rate"`; `yaml:",inline"` for a struct whose fields are the
// mapping's too). A key T lacks is refused. Null reads as absent. The
// zero Block is absent.
type Block[T any] struct {
	V    T              // the fields
	Set  bool           // given, and not null
	Line int            // of the mapping (its first key, for a block mapping)
	Keys map[string]int // the line of each key written in it (not merged)
	Bad  *Problem       // what is wrong, Field relative to the block; nil when nothing is
}

// UnmarshalYAML checks that the value is a mapping of T's fields and
// decodes it into b.V, keeping what is wrong in b.Bad.
func (b *Block[T]) UnmarshalYAML(decode func(any) error) error {
	n, err := ValueOf(decode)
	if err != nil {
		return err
	}
	b.Set, b.Line = true, lineOf(n)
	if msg := refused(n); msg != "" {
		b.Bad = &Problem{Line: b.Line, Msg: msg}
		return nil
	}
	m, ok := n.(*ast.MappingNode)
	if !ok {
		if _, null := n.(*ast.NullNode); null {
			b.Set = false
			return nil
		}
		b.Bad = &Problem{Line: b.Line, Msg: "must be a mapping, got " + kindOf(n)}
		return nil
	}
	// Keys written in the mapping override those merged into it (<<),
	// wherever the merge key is: the decoder takes the last.
	slices.SortStableFunc(m.Values, func(x, y *ast.MappingValueNode) int {
		return cmp.Compare(mergeFirst(x), mergeFirst(y))
	})
	// Decode first, so that what can be read is read (a rule's name, for
	// its errors) even when a key is unknown.
	err = decode(&b.V)
	names := fieldNames(reflect.TypeFor[T]())
	b.Keys = map[string]int{}
	for _, mv := range m.Values {
		if mv.Key.IsMergeKey() {
			continue
		}
		k, ok := mv.Key.(*ast.StringNode)
		if !ok {
			b.Bad = &Problem{Line: lineOf(mv.Key), Msg: "keys must be field names, got " + kindOf(mv.Key)}
			return nil
		}
		if !slices.Contains(names, k.Value) {
			b.Bad = unknownField(k.Value, lineOf(k), names)
			return nil
		}
		b.Keys[k.Value] = lineOf(k)
	}
	if err != nil {
		b.Bad = yamlError(err)
		var ye yaml.Error
		if errors.As(err, &ye) && strings.HasPrefix(ye.GetMessage(), "unknown field") && ye.GetToken() != nil {
			// A key merged in (<<) that T lacks.
			b.Bad = unknownField(ye.GetToken().Value, b.Bad.Line, names)
		}
	}
	return nil
}

// mergeFirst orders merge keys (<<) before the keys written.
func mergeFirst(mv *ast.MappingValueNode) int {
	if mv.Key.IsMergeKey() {
		return 0
	}
	return 1
}

// unknownField is the Problem of key, at line, in a block of the fields
// expected.
func unknownField(key string, line int, expected []string) *Problem {
	return &Problem{Field: key, Line: line, Msg: "unknown field; expected " + orList(expected)}
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

// List is a list field whose entries decode into T (a Val, a Block, or a
// type of one's own). Null reads as absent; so does a null entry, the
// zero T. The zero List is absent.
type List[T any] struct {
	V    []T    // the entries
	Set  bool   // given, and not null
	Line int    // of the list
	At   []int  // the line of each entry
	Got  string // what the value is when it is not a list; "" when it is
	Bad  string // what else is wrong; "" when nothing is
}

// UnmarshalYAML checks that the value is a list and decodes its entries.
func (l *List[T]) UnmarshalYAML(decode func(any) error) error {
	n, err := ValueOf(decode)
	if err != nil {
		return err
	}
	l.Set, l.Line = true, lineOf(n)
	if l.Bad = refused(n); l.Bad != "" {
		return nil
	}
	seq, ok := n.(*ast.SequenceNode)
	if !ok {
		if _, null := n.(*ast.NullNode); null {
			l.Set = false
			return nil
		}
		l.Got = kindOf(n)
		return nil
	}
	for _, v := range seq.Values {
		l.At = append(l.At, lineOf(v))
	}
	if err := decode(&l.V); err != nil {
		l.Bad = yamlError(err).Msg
	}
	return nil
}

// Lines maps the paths of the fields read ("" for what is read as a
// whole) to their lines.
type Lines map[string]int

// Of returns the line of field, or of the nearest field above it that has
// one ("gcra" for "gcra.rate", then ""); 0 when none has.
func (ls Lines) Of(field string) int {
	if ls == nil {
		return 0
	}
	for f := field; ; {
		if n, ok := ls[f]; ok {
			return n
		}
		i := strings.LastIndexByte(f, '.')
		if i < 0 {
			if f == "" {
				return 0
			}
			f = ""
			continue
		}
		f = f[:i]
	}
}

// Reader reads decoded fields, keeping the first problem met and the line
// of every field read. The zero Reader is ready to use.
type Reader struct {
	First *Problem // the first problem met; nil when none was
	Lines Lines    // the line of every field read
}

// Fail records a problem unless one is already.
func (r *Reader) Fail(field string, line int, format string, args ...any) {
	if r.First == nil {
		r.First = &Problem{Field: field, Line: line, Msg: fmt.Sprintf(format, args...)}
	}
}

// line records line as field's unless it has one.
func (r *Reader) line(field string, line int) {
	if r.Lines == nil {
		r.Lines = Lines{}
	}
	if _, ok := r.Lines[field]; !ok {
		r.Lines[field] = line
	}
}

// At records the lines of the keys written in a block (Block.Keys), under
// field.
func (r *Reader) At(field string, keys map[string]int) {
	for k, line := range keys {
		r.line(Join(field, k), line)
	}
}

// Get returns the value of s, field, and whether it was given and is
// valid; when it is wrong, r fails.
func Get[T ValType](r *Reader, field string, s Val[T]) (T, bool) {
	if s.Line > 0 {
		r.line(field, s.Line)
	}
	if s.Bad != "" {
		r.Fail(field, s.Line, "%s", s.Bad)
		return s.V, false
	}
	return s.V, s.Set
}

// Open returns the fields of b, field, or nil when it was not given or is
// wrong (then r fails).
func Open[T any](r *Reader, field string, b *Block[T]) *T {
	if !b.Set {
		return nil
	}
	r.line(field, b.Line)
	if b.Bad != nil {
		r.Fail(Join(field, b.Bad.Field), b.Bad.Line, "%s", b.Bad.Msg)
		return nil
	}
	return &b.V
}

// Must is Open for a block that cannot be absent or null, such as a
// document or an entry of a list of mappings (at line).
func Must[T any](r *Reader, field string, line int, b *Block[T]) *T {
	if !b.Set {
		r.Fail(field, max(b.Line, line), "must be a mapping, got null (an empty value)")
		return nil
	}
	return Open(r, field, b)
}

// Entries returns the entries of l, field, or nil when it was not given or
// is wrong (then r fails); want describes a valid value, e.g. "a list of
// rules".
func Entries[T any](r *Reader, field string, l *List[T], want string) []T {
	switch {
	case l.Bad != "":
		r.Fail(field, l.Line, "%s", l.Bad)
		return nil
	case l.Got != "":
		r.Fail(field, l.Line, "must be %s, got %s", want, l.Got)
		return nil
	}
	return l.V
}

// Skip is a field whose value this reader accepts whatever it is and does
// not read: another reader does, e.g. with DecodeSection.
type Skip struct{}

// UnmarshalYAML accepts the value.
func (*Skip) UnmarshalYAML(func(any) error) error { return nil }

// OrBlock is a field written either as a scalar (Val) or as a mapping
// (Block), such as a rule's fair: "{{.id}}" or fair: {key: ..., weight:
// ...}. The zero OrBlock is absent.
type OrBlock[T ValType, B any] struct {
	Val   Val[T]
	Block Block[B]
}

// UnmarshalYAML decodes a mapping into o.Block and anything else into
// o.Val.
func (o *OrBlock[T, B]) UnmarshalYAML(decode func(any) error) error {
	n, err := ValueOf(decode)
	if err != nil {
		return err
	}
	if _, ok := n.(*ast.MappingNode); ok {
		return o.Block.UnmarshalYAML(decode)
	}
	return o.Val.UnmarshalYAML(decode)
}

// Map is a mapping field whose keys are names of the document's own (a
// rule's tiers: plan -> limit), each value decoded into T (a Val, a Block,
// or a type of one's own). Null reads as absent. The zero Map is absent.
type Map[T any] struct {
	V     map[string]T   // the values by name
	Names []string       // the names, in the order written
	Set   bool           // given, and not null
	Line  int            // of the mapping
	At    map[string]int // the line of each name
	Bad   *Problem       // what is wrong, Field relative to the map; nil when nothing is
}

// UnmarshalYAML checks that the value is a mapping of names and decodes
// its values, keeping what is wrong in m.Bad.
func (m *Map[T]) UnmarshalYAML(decode func(any) error) error {
	n, err := ValueOf(decode)
	if err != nil {
		return err
	}
	m.Set, m.Line = true, lineOf(n)
	if msg := refused(n); msg != "" {
		m.Bad = &Problem{Line: m.Line, Msg: msg}
		return nil
	}
	mn, ok := n.(*ast.MappingNode)
	if !ok {
		if _, null := n.(*ast.NullNode); null {
			m.Set = false
			return nil
		}
		m.Bad = &Problem{Line: m.Line, Msg: "must be a mapping of names, got " + kindOf(n)}
		return nil
	}
	m.At = map[string]int{}
	for _, mv := range mn.Values {
		k, ok := mv.Key.(*ast.StringNode)
		if !ok || mv.Key.IsMergeKey() {
			m.Bad = &Problem{Line: lineOf(mv.Key), Msg: "keys must be names, got " + kindOf(mv.Key)}
			return nil
		}
		m.Names, m.At[k.Value] = append(m.Names, k.Value), lineOf(k)
	}
	if err := decode(&m.V); err != nil {
		m.Bad = yamlError(err)
	}
	return nil
}
