// Package svgtest reads back, for tests, the SVG charts package plot
// writes: it parses them with encoding/xml and finds their elements by the
// ids, classes and data- attributes plot documents.
package svgtest

import (
	"bytes"
	"encoding/xml"
	"io"
	"strconv"
	"strings"
	"testing"
)

// Node is one element of a parsed document.
type Node struct {
	// Name is the element's local name, Space its namespace; Attr its
	// attributes by local name.
	Name, Space string
	Attr        map[string]string
	// Text is the character data directly inside the element.
	Text     string
	Children []*Node
}

// Doc is a parsed chart.
type Doc struct {
	Root *Node
	all  []*Node
}

// Parse parses data as XML whose root is an <svg> element, failing t when
// it is not.
func Parse(t testing.TB, data []byte) *Doc {
	t.Helper()
	d := &Doc{}
	dec := xml.NewDecoder(bytes.NewReader(data))
	var stack []*Node
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the SVG does not parse: %v", err)
		}
		switch v := tok.(type) {
		case xml.StartElement:
			n := &Node{Name: v.Name.Local, Space: v.Name.Space, Attr: map[string]string{}}
			for _, a := range v.Attr {
				n.Attr[a.Name.Local] = a.Value
			}
			if len(stack) > 0 {
				p := stack[len(stack)-1]
				p.Children = append(p.Children, n)
			} else if d.Root != nil {
				t.Fatal("the SVG has two root elements")
			} else {
				d.Root = n
			}
			stack = append(stack, n)
			d.all = append(d.all, n)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) > 0 {
				stack[len(stack)-1].Text += string(v)
			}
		}
	}
	if d.Root == nil || d.Root.Name != "svg" || d.Root.Space != "http://www.w3.org/2000/svg" {
		t.Fatalf("the root is not an svg element in the SVG namespace")
	}
	return d
}

// ID returns the element with id, failing t when there is none.
func (d *Doc) ID(t testing.TB, id string) *Node {
	t.Helper()
	for _, n := range d.all {
		if n.Attr["id"] == id {
			return n
		}
	}
	t.Fatalf("no element with id %q", id)
	return nil
}

// Class returns the elements whose class is class, in document order.
func (d *Doc) Class(class string) []*Node {
	var out []*Node
	for _, n := range d.all {
		if n.Attr["class"] == class {
			out = append(out, n)
		}
	}
	return out
}

// Num returns n's attribute name as a number, failing t when it is not.
func (n *Node) Num(t testing.TB, name string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(n.Attr[name], 64)
	if err != nil {
		t.Fatalf("<%s> attribute %s=%q: %v", n.Name, name, n.Attr[name], err)
	}
	return v
}

// Points returns a polyline's points as x, y pairs.
func (n *Node) Points(t testing.TB) [][2]float64 {
	t.Helper()
	var out [][2]float64
	for _, p := range strings.Fields(n.Attr["points"]) {
		xs, ys, ok := strings.Cut(p, ",")
		x, err1 := strconv.ParseFloat(xs, 64)
		y, err2 := strconv.ParseFloat(ys, 64)
		if !ok || err1 != nil || err2 != nil {
			t.Fatalf("bad point %q in %q", p, n.Attr["points"])
		}
		out = append(out, [2]float64{x, y})
	}
	return out
}

// Axis maps values to coordinates as the ticks of one axis say.
type Axis struct {
	// Ticks are the tick values, in order, and At their coordinates.
	Ticks, At []float64
}

// XAxis reads the x ticks (<line class="x-tick">, value in seconds, at
// x1); YAxis the y ticks (<line class="y-tick">, at y1). Both fail t with
// fewer than two ticks or ticks whose line and label disagree.
func (d *Doc) XAxis(t testing.TB) Axis { t.Helper(); return d.axis(t, "x") }

// YAxis: see XAxis.
func (d *Doc) YAxis(t testing.TB) Axis { t.Helper(); return d.axis(t, "y") }

func (d *Doc) axis(t testing.TB, which string) Axis {
	t.Helper()
	var a Axis
	for _, n := range d.Class(which + "-tick") {
		a.Ticks = append(a.Ticks, n.Num(t, "data-value"))
		a.At = append(a.At, n.Num(t, which+"1"))
	}
	labels := d.Class(which + "-tick-label")
	if len(a.Ticks) < 2 || len(labels) != len(a.Ticks) {
		t.Fatalf("%d %s ticks, %d labels", len(a.Ticks), which, len(labels))
	}
	for i, l := range labels {
		if l.Num(t, "data-value") != a.Ticks[i] {
			t.Fatalf("%s tick %d: line at value %v, label %v", which, i, a.Ticks[i], l.Attr["data-value"])
		}
	}
	return a
}

// Pos is the coordinate of value v, interpolated between the first and
// the last tick.
func (a Axis) Pos(v float64) float64 {
	n := len(a.Ticks) - 1
	return a.At[0] + (v-a.Ticks[0])*(a.At[n]-a.At[0])/(a.Ticks[n]-a.Ticks[0])
}

// Value is the value at coordinate p: Pos's inverse.
func (a Axis) Value(p float64) float64 {
	n := len(a.Ticks) - 1
	return a.Ticks[0] + (p-a.At[0])*(a.Ticks[n]-a.Ticks[0])/(a.At[n]-a.At[0])
}

// Max is the last tick's value.
func (a Axis) Max() float64 { return a.Ticks[len(a.Ticks)-1] }
