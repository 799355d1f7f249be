package sagapic

import (
	"fmt"
	"strings"

	"github.com/sagabox/sagabox/saga"
)

// GraphOpts changes what a graph shows. A nil *GraphOpts draws the
// definition alone.
type GraphOpts struct {
	// Instance, when set, is a saga of the shape's definition: each step is
	// coloured by its state in it (pending, in flight, succeeded, skipped,
	// rejected or timed out, compensated, compensation failed), the steps
	// in flight are highlighted (their compensation box when that is what
	// is in flight), and the end shows the saga's status once it has ended.
	// Steps are matched by name.
	Instance *saga.Instance
}

func (o *GraphOpts) instance() *saga.Instance {
	if o == nil {
		return nil
	}
	return o.Instance
}

// The graph's measures, in pixels.
const (
	fontFamily   = "system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', Arial, sans-serif"
	titlePx      = 13.0
	detailPx     = 11.0
	boxH         = 58.0
	minBoxW      = 150.0
	maxBoxW      = 270.0
	boxPad       = 12.0
	compGap      = 60.0
	branchGap    = 28.0
	rowGap       = 34.0
	margin       = 20.0
	groupPad     = 14.0
	groupLabelH  = 22.0
	barH         = 4.0
	barGap       = 22.0
	pillH        = 30.0
	legendH      = 34.0
	flowColour   = "#4b5563"
	compColour   = "#b45309"
	highlight    = "#2563eb"
	compHighlite = "#d97706"
)

// stepLabel is what a step's box says.
type stepLabel struct {
	title, kind, badges string
}

// labelOf returns the lines of n's box.
func labelOf(n saga.ShapeNode) stepLabel {
	l := stepLabel{title: n.Name}
	var badges []string
	switch n.Kind {
	case saga.NodeStep:
		l.kind = n.Action
	case saga.NodeLocal:
		l.kind = "local step"
	case saga.NodeWait:
		l.kind = "waits for event " + n.Event
	default:
		l.kind = string(n.Kind)
		if n.Action != "" {
			l.kind += ": " + n.Action
		}
	}
	if n.Timeout > 0 {
		badges = append(badges, "timeout "+duration(n.Timeout))
	}
	if n.Retry != nil && n.Retry.MaxAttempts > 1 {
		badges = append(badges, fmt.Sprintf("%d attempts", n.Retry.MaxAttempts))
	}
	if n.Conditional {
		badges = append(badges, "conditional")
	}
	l.badges = strings.Join(badges, " · ")
	return l
}

// compLabel returns the lines of n's compensation box.
func compLabel(n saga.ShapeNode) stepLabel {
	l := stepLabel{title: n.Compensation, kind: "compensation of " + n.Name}
	if n.CompensationTimeout > 0 {
		l.badges = "re-sent after " + duration(n.CompensationTimeout)
	}
	return l
}

// describe is the tooltip of n's box.
func describe(n saga.ShapeNode, st *stepLook) string {
	var parts []string
	switch n.Kind {
	case saga.NodeStep:
		parts = append(parts, "sends "+n.Action)
	case saga.NodeLocal:
		parts = append(parts, "runs in the orchestrator's transaction")
	case saga.NodeWait:
		parts = append(parts, "waits for the outside event "+n.Event)
	default:
		parts = append(parts, "a step of kind "+string(n.Kind))
	}
	if n.Compensation != "" {
		parts = append(parts, "compensated by "+n.Compensation)
	}
	if n.Timeout > 0 {
		parts = append(parts, "timeout "+duration(n.Timeout))
	}
	if n.ScheduleToStartTimeout > 0 {
		parts = append(parts, "times out when a command stays unpublished "+duration(n.ScheduleToStartTimeout))
	}
	if r := n.Retry; r != nil && r.MaxAttempts > 1 {
		parts = append(parts, fmt.Sprintf("up to %d attempts, the first re-send after %s", r.MaxAttempts, duration(r.InitialInterval)))
	}
	if n.Conditional {
		parts = append(parts, "skipped when its predicate is false")
	}
	if st != nil {
		parts = append(parts, "status: "+string(st.status))
	}
	return n.Name + ": " + strings.Join(parts, "; ")
}

// svgWriter accumulates SVG; every text it is given is escaped.
type svgWriter struct{ b strings.Builder }

func (w *svgWriter) raw(format string, args ...any) { fmt.Fprintf(&w.b, format, args...) }

// text writes a text element at (x, y) anchored as anchor.
func (w *svgWriter) text(x, y float64, anchor string, px float64, weight, fill, s string) {
	if s == "" {
		return
	}
	w.raw(`<text x="%s" y="%s" text-anchor="%s" font-size="%s"`, num(x), num(y), anchor, num(px))
	if weight != "" {
		w.raw(` font-weight="%s"`, weight)
	}
	w.raw(` fill="%s">%s</text>`+"\n", fill, xmlText(s))
}

// arrow writes a path from (x1, y1) to (x2, y2) ending in marker.
func (w *svgWriter) arrow(class string, x1, y1, x2, y2 float64, colour, dash, marker string) {
	w.raw(`<path class="%s" d="M%s %sL%s %s" fill="none" stroke="%s" stroke-width="1.5"`, class, num(x1), num(y1), num(x2), num(y2), colour)
	if dash != "" {
		w.raw(` stroke-dasharray="%s"`, dash)
	}
	w.raw(` marker-end="url(#%s)"/>`+"\n", marker)
}

// graph is the layout of a shape's graph.
type graph struct {
	sh     saga.Shape
	states map[string]stepLook
	inst   *saga.Instance
	aw, cw float64 // the widths of action and compensation boxes
	axis   float64
	width  float64
	height float64
	w      svgWriter
}

// GraphSVG draws sh as an SVG graph: the saga's steps from top to bottom
// between a start and an end, a parallel group's branches side by side
// between a fork and a join bar, each step's compensation beside it with a
// dashed arrow back to the step it undoes. A command step shows its
// command, a local step a violet edge, a wait step a rounded box with the
// event it waits for; timeouts, retries and conditions are written under
// the step's name. Each step is a <g class="node"> with data-step,
// data-kind and, with an instance, data-status attributes, and the class
// "current" when it is in flight.
func GraphSVG(sh saga.Shape, opts *GraphOpts) string {
	g := &graph{sh: sh, inst: opts.instance()}
	g.states = states(g.inst)
	g.measure()
	return g.draw()
}

// measure sets the boxes' widths, the axis and the picture's width.
func (g *graph) measure() {
	g.aw, g.cw = minBoxW, minBoxW
	for _, n := range g.sh.Steps() {
		g.aw = max(g.aw, labelWidth(labelOf(n)))
		if n.Compensation != "" {
			g.cw = max(g.cw, labelWidth(compLabel(n)))
		}
	}
	g.aw, g.cw = min(g.aw, maxBoxW), min(g.cw, maxBoxW)
	left, right := 0.0, 0.0
	pill := func(s string) {
		w := pillWidth(s)
		left, right = max(left, w/2), max(right, w/2)
	}
	pill(g.title())
	pill("completed")
	for _, n := range g.sh.Nodes {
		if n.Kind == saga.NodeParallel {
			half := g.groupWidth(n) / 2
			left, right = max(left, half), max(right, half)
			continue
		}
		left = max(left, g.aw/2)
		r := g.aw / 2
		if n.Compensation != "" {
			r += compGap + g.cw
		}
		right = max(right, r)
	}
	g.axis = margin + left
	g.width = max(g.axis+right+margin, legendWidth()+2*margin)
}

func labelWidth(l stepLabel) float64 {
	return max(textWidth(l.title, titlePx, true), textWidth(l.kind, detailPx, false), textWidth(l.badges, detailPx, false)) + 2*boxPad
}

func pillWidth(s string) float64 {
	return min(textWidth(s, titlePx, true), 2*maxBoxW) + 36
}

// branchWidth is the width branch b of a group takes: its box, and its
// compensation's beside it.
func (g *graph) branchWidth(b saga.ShapeNode) float64 {
	if b.Compensation != "" {
		return g.aw + compGap + g.cw
	}
	return g.aw
}

func (g *graph) groupWidth(n saga.ShapeNode) float64 {
	if len(n.Branches) == 0 {
		return g.aw + 2*groupPad
	}
	w := float64(len(n.Branches)-1)*branchGap + 2*groupPad
	for _, b := range n.Branches {
		w += g.branchWidth(b)
	}
	return w
}

func (g *graph) title() string { return fmt.Sprintf("%s v%d", g.sh.Name, g.sh.Version) }

// The legend, in two parts.
const (
	legendFlow = "→ order of the steps"
	legendUndo = "⇠ compensation: undoes its step, in reverse order, when a later step fails"
)

// legendWidth is the width of the legend's line.
func legendWidth() float64 {
	return textWidth(legendFlow, detailPx, false) + 24 + textWidth(legendUndo, detailPx, false)
}

// draw returns the picture.
func (g *graph) draw() string {
	body := &g.w
	y := margin
	// The start.
	title := g.title()
	g.pill("start", title, title, lookPlain, y)
	exit := y + pillH
	y += pillH + rowGap
	for _, n := range g.sh.Nodes {
		if n.Kind == saga.NodeParallel {
			exit, y = g.group(n, exit, y)
			continue
		}
		body.arrow("edge", g.axis, exit, g.axis, y, flowColour, "", "sagapic-arrow")
		g.step(n, g.axis-g.aw/2, y)
		exit = y + boxH
		y += boxH + rowGap
	}
	// The end.
	endL, endText := endLook(g.inst)
	body.arrow("edge", g.axis, exit, g.axis, y, flowColour, "", "sagapic-arrow")
	g.pill("end", endText, endText, endL, y)
	y += pillH + 18
	body.raw(`<g class="legend">`)
	body.text(margin, y+detailPx, "start", detailPx, "", flowColour, legendFlow)
	body.text(margin+textWidth(legendFlow, detailPx, false)+24, y+detailPx, "start", detailPx, "", compColour, legendUndo)
	body.raw("</g>\n")
	g.height = y + legendH - 18 + margin

	var out svgWriter
	out.raw(`<svg xmlns="http://www.w3.org/2000/svg" class="sagapic sagapic-graph" width="%s" height="%s" viewBox="0 0 %s %s" font-family="%s" role="img" aria-label="%s">`+"\n",
		num(g.width), num(g.height), num(g.width), num(g.height), xmlText(fontFamily), xmlText("saga "+title))
	out.raw("<title>%s</title>\n", xmlText("saga "+title))
	out.raw(`<defs>` +
		`<marker id="sagapic-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0 0L10 5L0 10z" fill="` + flowColour + `"/></marker>` +
		`<marker id="sagapic-undo" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0 0L10 5L0 10z" fill="` + compColour + `"/></marker>` +
		"</defs>\n")
	out.raw(`<rect class="background" width="%s" height="%s" fill="#ffffff"/>`+"\n", num(g.width), num(g.height))
	out.b.WriteString(body.b.String())
	out.raw("</svg>\n")
	return out.b.String()
}

// pill draws the start or the end.
func (g *graph) pill(class, label, tip string, l look, y float64) {
	w := &g.w
	pw := pillWidth(label)
	w.raw(`<g class="%s">`, class)
	w.raw("<title>%s</title>", xmlText(tip))
	w.raw(`<rect x="%s" y="%s" width="%s" height="%s" rx="15" fill="%s" stroke="%s" stroke-width="1.5"/>`,
		num(g.axis-pw/2), num(y), num(pw), num(pillH), l.fill, l.stroke)
	w.text(g.axis, y+pillH/2+titlePx*0.36, "middle", titlePx, "600", l.text, fit(label, pw-24, titlePx, true))
	w.raw("</g>\n")
}

// step draws step n with its box's left edge at x and top at y, and its
// compensation beside it.
func (g *graph) step(n saga.ShapeNode, x, y float64) {
	w := &g.w
	var st *stepLook
	if s, ok := g.states[n.Name]; ok {
		st = &s
	}
	l := lookPlain
	if g.states != nil {
		l = lookPending
	}
	current := false
	if st != nil {
		l = st.action
		current = st.current && !st.currentComp
	}
	kind := string(n.Kind)
	if !n.Kind.Known() {
		kind = "unknown"
	}
	classes := "node " + kind
	if l.class != "" {
		classes += " " + l.class
	}
	if current {
		classes += " current"
	}
	w.raw(`<g class="%s" data-step="%s" data-kind="%s" data-index="%d"`, classes, xmlText(n.Name), xmlText(string(n.Kind)), n.Index)
	if st != nil {
		w.raw(` data-status="%s"`, xmlText(string(st.status)))
	}
	w.raw(">\n<title>%s</title>\n", xmlText(describe(n, st)))
	rx := "8"
	dash := ""
	switch n.Kind {
	case saga.NodeLocal:
		rx = "2"
	case saga.NodeWait:
		rx = "24"
	case saga.NodeStep:
	default:
		dash = ` stroke-dasharray="5 3"`
	}
	if current {
		w.raw(`<rect class="highlight" x="%s" y="%s" width="%s" height="%s" rx="12" fill="none" stroke="%s" stroke-width="4" stroke-opacity="0.35"/>`+"\n",
			num(x-5), num(y-5), num(g.aw+10), num(boxH+10), highlight)
	}
	width := "1.5"
	if current {
		width = "3"
	}
	w.raw(`<rect x="%s" y="%s" width="%s" height="%s" rx="%s" fill="%s" stroke="%s" stroke-width="%s"%s/>`+"\n",
		num(x), num(y), num(g.aw), num(boxH), rx, l.fill, l.stroke, width, dash)
	if n.Kind == saga.NodeLocal {
		w.raw(`<rect class="local-mark" x="%s" y="%s" width="5" height="%s" fill="#7c3aed"/>`+"\n", num(x+1), num(y+1), num(boxH-2))
	}
	g.lines(labelOf(n), x, y, g.aw, l)
	w.raw("</g>\n")
	if n.Compensation != "" {
		g.compensation(n, st, x+g.aw+compGap, y)
		mid := y + boxH/2
		w.arrow("undo", x+g.aw+compGap, mid, x+g.aw+1, mid, compColour, "5 4", "sagapic-undo")
		w.text(x+g.aw+compGap/2, mid-6, "middle", 10, "", compColour, "undo")
	}
}

// lines writes the three lines of a box.
func (g *graph) lines(l stepLabel, x, y, width float64, lk look) {
	w := &g.w
	cx, room := x+width/2, width-2*boxPad
	w.text(cx, y+19, "middle", titlePx, "600", lk.text, fit(l.title, room, titlePx, true))
	w.text(cx, y+35, "middle", detailPx, "", "#4b5563", fit(l.kind, room, detailPx, false))
	w.text(cx, y+50, "middle", detailPx, "", "#6b7280", fit(l.badges, room, detailPx, false))
}

// compensation draws n's compensation box at (x, y).
func (g *graph) compensation(n saga.ShapeNode, st *stepLook, x, y float64) {
	w := &g.w
	l := lookPlainComp
	if g.states != nil {
		l = lookPending
	}
	current := false
	if st != nil {
		l = st.comp
		current = st.current && st.currentComp
	}
	classes := "compensation"
	if l.class != "" {
		classes += " " + l.class
	}
	if current {
		classes += " current"
	}
	w.raw(`<g class="%s" data-step="%s">`+"\n", classes, xmlText(n.Name))
	w.raw("<title>%s</title>\n", xmlText(n.Compensation+": compensates "+n.Name))
	if current {
		w.raw(`<rect class="highlight" x="%s" y="%s" width="%s" height="%s" rx="12" fill="none" stroke="%s" stroke-width="4" stroke-opacity="0.35"/>`+"\n",
			num(x-5), num(y-5), num(g.cw+10), num(boxH+10), compHighlite)
	}
	width := "1.5"
	if current {
		width = "3"
	}
	w.raw(`<rect x="%s" y="%s" width="%s" height="%s" rx="8" fill="%s" stroke="%s" stroke-width="%s" stroke-dasharray="6 3"/>`+"\n",
		num(x), num(y), num(g.cw), num(boxH), l.fill, l.stroke, width)
	g.lines(compLabel(n), x, y, g.cw, l)
	w.raw("</g>\n")
}

// group draws the parallel group n at y, entered from exit on the axis,
// and returns its exit and the next row's top.
func (g *graph) group(n saga.ShapeNode, exit, y float64) (float64, float64) {
	w := &g.w
	gw := g.groupWidth(n)
	left := g.axis - gw/2
	forkY := y + groupLabelH
	boxY := forkY + barH + barGap
	joinY := boxY + boxH + barGap
	bottom := joinY + barH + 12
	w.raw(`<g class="group" data-group="%s">`+"\n", xmlText(n.Name))
	w.raw("<title>%s</title>\n", xmlText(fmt.Sprintf("parallel group %s: %d branches run side by side; the saga moves on when all have succeeded", n.Name, len(n.Branches))))
	w.raw(`<rect x="%s" y="%s" width="%s" height="%s" rx="10" fill="#f9fafb" stroke="#9ca3af" stroke-dasharray="4 4"/>`+"\n",
		num(left), num(y), num(gw), num(bottom-y))
	w.text(left+groupPad, y+15, "start", detailPx, "600", "#374151", fit("parallel: "+n.Name, gw/2-groupPad-8, detailPx, true))
	w.raw("</g>\n")
	centres := make([]float64, len(n.Branches))
	x := left + groupPad
	for i, b := range n.Branches {
		centres[i] = x + g.aw/2
		x += g.branchWidth(b) + branchGap
	}
	lo, hi := g.axis, g.axis
	for _, c := range centres {
		lo, hi = min(lo, c), max(hi, c)
	}
	w.arrow("edge", g.axis, exit, g.axis, forkY, flowColour, "", "sagapic-arrow")
	for _, barY := range []float64{forkY, joinY} {
		w.raw(`<rect class="bar" x="%s" y="%s" width="%s" height="%s" fill="#374151"/>`+"\n", num(lo-6), num(barY), num(hi-lo+12), num(barH))
	}
	for i, b := range n.Branches {
		c := centres[i]
		w.arrow("edge", c, forkY+barH, c, boxY, flowColour, "", "sagapic-arrow")
		if b.Kind == saga.NodeParallel {
			b = saga.ShapeNode{Kind: "parallel", Name: b.Name, Index: b.Index} // nested groups are not drawn inside
		}
		g.step(b, c-g.aw/2, boxY)
		w.arrow("edge", c, boxY+boxH, c, joinY, flowColour, "", "sagapic-arrow")
	}
	return joinY + barH, bottom + rowGap
}
