package sagapic_test

import (
	"encoding/xml"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/saga/sagapic"
	"github.com/sagabox/sagabox/saga/sagatest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run `go test ./saga/sagapic -update` to write the golden files")
	require.Equal(t, string(want), got, "%s changed: look at it, then run `go test ./saga/sagapic -update`", path)
}

// element is an SVG element as parsed: its name, attributes and text.
type element struct {
	name  string
	attrs map[string]string
	text  string
}

// parseSVG parses svg strictly as XML and returns its elements in
// document order; it fails the test on anything a browser's XML parser
// would refuse.
func parseSVG(t *testing.T, svg string) []element {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(svg))
	d.Strict = true
	var out []element
	var stack []int
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "the SVG is not well-formed XML")
		switch x := tok.(type) {
		case xml.StartElement:
			e := element{name: x.Name.Local, attrs: map[string]string{}}
			for _, a := range x.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			out = append(out, e)
			stack = append(stack, len(out)-1)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) > 0 {
				out[stack[len(stack)-1]].text += string(x)
			}
		}
	}
	return out
}

// hasClass reports whether e's class attribute has class c.
func hasClass(e element, c string) bool {
	return strings.Contains(" "+e.attrs["class"]+" ", " "+c+" ")
}

// find returns the elements named name with class c.
func find(els []element, name, c string) []element {
	var out []element
	for _, e := range els {
		if e.name == name && hasClass(e, c) {
			out = append(out, e)
		}
	}
	return out
}

// allowedSVG lists what a sagapic SVG may hold: a page with the console's
// Content-Security-Policy renders it whole (no style element or attribute,
// no script, no foreign object, no link).
var allowedSVG = map[string]bool{"svg": true, "title": true, "defs": true, "marker": true, "path": true, "rect": true, "text": true, "g": true, "line": true}

func requireSafeSVG(t *testing.T, els []element) {
	t.Helper()
	for _, e := range els {
		require.True(t, allowedSVG[e.name], "element <%s>", e.name)
		for a := range e.attrs {
			require.NotEqual(t, "style", a, "a style attribute in <%s>: the console's CSP would drop it", e.name)
			require.False(t, strings.HasPrefix(strings.ToLower(a), "on"), "an event handler attribute %s in <%s>", a, e.name)
			require.NotEqual(t, "href", a, "a link in <%s>", e.name)
		}
	}
}

func TestGraphGoldenFiles(t *testing.T) {
	t.Parallel()
	sh := shop().Shape()
	waiting := waitingRun(t).Instance()
	done := compensatedRun(t).Instance()
	golden(t, "graph.svg", sagapic.GraphSVG(sh, nil))
	golden(t, "graph-waiting.svg", sagapic.GraphSVG(sh, &sagapic.GraphOpts{Instance: &waiting}))
	golden(t, "graph-compensated.svg", sagapic.GraphSVG(sh, &sagapic.GraphOpts{Instance: &done}))
	golden(t, "graph.dot", sagapic.GraphDOT(sh, nil))
	golden(t, "graph-waiting.dot", sagapic.GraphDOT(sh, &sagapic.GraphOpts{Instance: &waiting}))
	golden(t, "graph.mmd", sagapic.GraphMermaid(sh, nil))
	golden(t, "graph-waiting.mmd", sagapic.GraphMermaid(sh, &sagapic.GraphOpts{Instance: &waiting}))
}

// Every step of the shape is a node, with its kind; every compensation a
// box beside its step; the branches of a group side by side, the other
// steps one under the other, in order.
func TestGraphSVGDrawsEveryStepInItsPlace(t *testing.T) {
	t.Parallel()
	sh := shop().Shape()
	els := parseSVG(t, sagapic.GraphSVG(sh, nil))
	requireSafeSVG(t, els)
	require.Equal(t, "svg", els[0].name)
	require.True(t, hasClass(els[0], "sagapic-graph"))

	nodes := find(els, "g", "node")
	var names, kinds []string
	for _, n := range nodes {
		names = append(names, n.attrs["data-step"])
		kinds = append(kinds, n.attrs["data-kind"])
	}
	require.Equal(t, []string{"reserve", "charge", "notify", "await-confirmation", "mark-paid", "ship"}, names)
	require.Equal(t, []string{"step", "step", "step", "wait", "local", "step"}, kinds)

	var comps []string
	for _, c := range find(els, "g", "compensation") {
		comps = append(comps, c.attrs["data-step"])
	}
	require.Equal(t, []string{"reserve", "charge", "ship"}, comps, "a box per compensation, none for notify")
	require.Len(t, find(els, "path", "undo"), 3, "an arrow back from each compensation to its step")
	require.Len(t, find(els, "rect", "bar"), 2, "the group's fork and join bars")
	require.Len(t, find(els, "g", "group"), 1)

	// Positions: each node's first rect is its box.
	box := map[string][2]float64{}
	for i, e := range els {
		if e.name == "g" && hasClass(e, "node") {
			for _, r := range els[i+1:] {
				if r.name == "rect" && !hasClass(r, "highlight") {
					box[e.attrs["data-step"]] = [2]float64{atof(t, r.attrs["x"]), atof(t, r.attrs["y"])}
					break
				}
			}
		}
	}
	require.Equal(t, box["charge"][1], box["notify"][1], "the branches are side by side")
	require.Less(t, box["charge"][0], box["notify"][0])
	for _, pair := range [][2]string{{"reserve", "charge"}, {"notify", "await-confirmation"}, {"await-confirmation", "mark-paid"}, {"mark-paid", "ship"}} {
		require.Less(t, box[pair[0]][1], box[pair[1]][1], "%s above %s", pair[0], pair[1])
	}
	require.Equal(t, box["reserve"][0], box["ship"][0], "sequential steps on one axis")

	// Timeouts, retries, the event, the condition are written in the boxes.
	text := allText(els)
	for _, s := range []string{"timeout 30s", "3 attempts", "waits for event payment.confirmed", "timeout 1h", "local step", "conditional", "re-sent after 1m", "parallel: pay-and-notify"} {
		require.Contains(t, text, s)
	}
}

func allText(els []element) string {
	var b strings.Builder
	for _, e := range els {
		if e.name == "text" {
			b.WriteString(e.text + "\n")
		}
	}
	return b.String()
}

func atof(t *testing.T, s string) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(s, 64)
	require.NoError(t, err)
	return f
}

// With a saga, each step is coloured by its state and the step in flight
// is highlighted: the wait of a waiting saga, the compensations in flight
// of a compensating one.
func TestGraphSVGHighlightsTheCurrentStep(t *testing.T) {
	t.Parallel()
	sh := shop().Shape()
	waiting := waitingRun(t).Instance()
	els := parseSVG(t, sagapic.GraphSVG(sh, &sagapic.GraphOpts{Instance: &waiting}))
	current := find(els, "g", "current")
	require.Len(t, current, 1)
	require.Equal(t, "await-confirmation", current[0].attrs["data-step"])
	require.Equal(t, "waiting-event", current[0].attrs["data-status"])
	status := map[string]string{}
	for _, n := range find(els, "g", "node") {
		status[n.attrs["data-step"]] = n.attrs["data-status"]
	}
	require.Equal(t, map[string]string{"reserve": "succeeded", "charge": "succeeded", "notify": "succeeded",
		"await-confirmation": "waiting-event", "mark-paid": "pending", "ship": "pending"}, status)
	require.Len(t, find(els, "rect", "highlight"), 1)

	// Shipping rejected: the refund is in flight, its box is current.
	s := compensating(t)
	inst := s.Instance()
	els = parseSVG(t, sagapic.GraphSVG(sh, &sagapic.GraphOpts{Instance: &inst}))
	current = find(els, "g", "current")
	require.Len(t, current, 1)
	require.True(t, hasClass(current[0], "compensation"), "what is in flight is the refund")
	require.Equal(t, "charge", current[0].attrs["data-step"])
	for _, n := range find(els, "g", "node") {
		if n.attrs["data-step"] == "ship" {
			require.True(t, hasClass(n, "failed"), "the rejected step")
		}
	}

	// A compensated saga has nothing in flight and ends compensated.
	done := compensatedRun(t).Instance()
	els = parseSVG(t, sagapic.GraphSVG(sh, &sagapic.GraphOpts{Instance: &done}))
	require.Empty(t, find(els, "g", "current"))
	require.Len(t, find(els, "g", "compensated"), 2, "the refund and the release")
	require.Contains(t, allText(els), "compensated")
}

// compensating runs a shop saga until shipping rejects, and leaves the
// refund in flight.
func compensating(t *testing.T) *sagatest.Scenario[Order] {
	t.Helper()
	s := waitingRun(t)
	sagatest.SendEvent(s, confirmed, "evt-2", Confirmed{})
	sagatest.ExpectCommand(s, ship)
	s.ReplyFailure("no courier")
	sagatest.ExpectCompensation(s, refund)
	return s
}

// A shape with names that are markup, quotes, Graphviz escapes and Mermaid
// syntax: every format keeps them as text.
func hostile() saga.Shape {
	evil := `<script>alert("x")</script>`
	return saga.Shape{Format: 1, Name: `shop"]; click s0 call alert() %%`, Version: 1, Nodes: []saga.ShapeNode{
		{Kind: saga.NodeStep, Name: evil, Index: 0, Action: `"><img src=x onerror=alert(1)>`, Compensation: `a&b;#35; \N \l ]]>`,
			Timeout: time.Second},
		{Kind: saga.NodeParallel, Name: "g\" onload=\"alert(1)", Index: 1, Branches: []saga.ShapeNode{
			{Kind: saga.NodeWait, Name: "x\ny\x00z\x1b", Index: 1, Event: "`**md**` | [x](javascript:alert(1))"},
			{Kind: "timer\"><script>", Name: "'single'", Index: 2, Action: "end"},
		}},
		{Kind: saga.NodeLocal, Name: "end", Index: 3},
	}}
}

func TestGraphFormatsEscapeHostileNames(t *testing.T) {
	t.Parallel()
	sh := hostile()
	inst := &saga.Instance{Type: sh.Name, Version: 1, Status: saga.StatusRunning, CurrentStep: 0, Steps: []saga.StepState{
		{Name: sh.Nodes[0].Name, Status: saga.StepRunning}, {Name: "x\ny\x00z\x1b", Status: saga.StepPending},
	}}
	for _, opts := range []*sagapic.GraphOpts{nil, {Instance: inst}} {
		svg := sagapic.GraphSVG(sh, opts)
		els := parseSVG(t, svg)
		requireSafeSVG(t, els)
		require.NotContains(t, svg, "<script")
		require.NotContains(t, svg, "<img")
		var steps []string
		for _, n := range find(els, "g", "node") {
			steps = append(steps, n.attrs["data-step"])
		}
		require.Equal(t, []string{`<script>alert("x")</script>`, "x\ny\uFFFDz\uFFFD", "'single'", "end"}, steps,
			"names come back as they were, control characters replaced")
		require.Equal(t, `g" onload="alert(1)`, find(els, "g", "group")[0].attrs["data-group"])

		dot := sagapic.GraphDOT(sh, opts)
		requireDOTQuoted(t, dot)
		require.Contains(t, dot, `\\N \\l`, "a backslash is escaped, so no Graphviz escape survives")

		mmd := sagapic.GraphMermaid(sh, opts)
		for _, line := range strings.Split(mmd, "\n") {
			// Quotes only open and close our own labels.
			if i := strings.Index(line, `"`); i >= 0 {
				require.Equal(t, 2, strings.Count(line, `"`), "line %q", line)
			}
			require.NotContains(t, line, "<script", "line %q", line)
			require.NotContains(t, line, "<img")
			require.NotContains(t, line, "`")
		}
		require.Contains(t, mmd, "#60;script#62;alert#40;")
		require.NotContains(t, mmd, "%%", "no Mermaid comment")
		require.Contains(t, mmd, "finish((")
		require.NotRegexp(t, `(?m)^\s*click`, mmd, "no name becomes a Mermaid statement")
	}
}

// requireDOTQuoted checks that every double quote of dot opens or closes a
// string, every string closes on its line, and no name escapes its string.
func requireDOTQuoted(t *testing.T, dot string) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(dot), "\n") {
		in := false
		var outside strings.Builder
		for i := 0; i < len(line); i++ {
			switch c := line[i]; {
			case in && c == '\\':
				i++ // an escaped character
			case c == '"':
				in = !in
			case !in:
				outside.WriteByte(c)
			}
		}
		require.False(t, in, "an unterminated string in %q", line)
		require.NotContains(t, outside.String(), "script", "a name outside its quotes in %q", line)
		require.NotContains(t, outside.String(), "alert", "a name outside its quotes in %q", line)
	}
}

// A shape of a later version: a kind this package does not know is drawn
// as a plain step with its kind's name; an empty group and an empty shape
// are drawn, not refused.
func TestGraphDrawsWhatItDoesNotKnow(t *testing.T) {
	t.Parallel()
	sh := saga.Shape{Format: 2, Name: "later", Version: 7, Nodes: []saga.ShapeNode{
		{Kind: "timer", Name: "cool-off", Index: 0, Timeout: 5 * time.Second},
		{Kind: saga.NodeParallel, Name: "empty", Index: 1},
		{Kind: "child", Name: "loyalty", Index: 1, Action: "loyalty v1"},
	}}
	els := parseSVG(t, sagapic.GraphSVG(sh, nil))
	nodes := find(els, "g", "node")
	require.Len(t, nodes, 2)
	require.Equal(t, "timer", nodes[0].attrs["data-kind"])
	require.True(t, hasClass(nodes[0], "unknown"))
	require.Contains(t, allText(els), "timeout 5s")
	require.Contains(t, allText(els), "child: loyalty v1")
	require.Contains(t, sagapic.GraphDOT(sh, nil), "cool-off")
	require.Contains(t, sagapic.GraphMermaid(sh, nil), "cool-off")

	empty := saga.Shape{Name: "nothing", Version: 1}
	els = parseSVG(t, sagapic.GraphSVG(empty, nil))
	require.Empty(t, find(els, "g", "node"))
	require.Len(t, find(els, "g", "start"), 1)
	require.Len(t, find(els, "g", "end"), 1)
	require.Contains(t, sagapic.GraphDOT(empty, nil), "start -> finish;")
	require.Contains(t, sagapic.GraphMermaid(empty, nil), "start --> finish")
}

// A step's schedule-to-start timeout is in its box's tooltip.
func TestGraphSVGScheduleToStartInTheTooltip(t *testing.T) {
	t.Parallel()
	sh := saga.Shape{Format: saga.ShapeFormat, Name: "s", Version: 1, Nodes: []saga.ShapeNode{
		{Kind: saga.NodeStep, Name: "award", Action: "loyalty.award", ScheduleToStartTimeout: 10 * time.Minute},
	}}
	require.Contains(t, sagapic.GraphSVG(sh, nil), "award: sends loyalty.award; times out when a command stays unpublished 10m")
}
