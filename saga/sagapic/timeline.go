package sagapic

import (
	"fmt"
	"strings"
	"time"

	"github.com/sagabox/sagabox/saga"
)

// TimelineOpts changes what a timeline shows. A nil *TimelineOpts takes
// the defaults.
type TimelineOpts struct {
	// Now is where the bars of what is still in flight end: the time the
	// picture is drawn (the caller's clock; this package reads none). A
	// time before the last history entry is ignored. Defaults to the last
	// history entry's time.
	Now time.Time
}

// The timeline's measures, in pixels.
const (
	tlLabelW  = 210.0
	tlPlotW   = 640.0
	tlRightW  = 120.0
	tlTop     = 62.0
	tlRowH    = 26.0
	tlBarH    = 14.0
	tlLegendH = 40.0
)

// segment is a bar of a timeline row: an attempt of a command, a wait, a
// compensation or a backoff, from when it began to when it ended.
type segment struct {
	kind     string // attempt, wait, compensation, backoff
	from, to time.Time
	attempt  int
	outcome  string // ok, rejected, timed-out, failed, superseded, abandoned, cancelled, terminated, open
	detail   string
}

// mark is an instant on a row: a local step, a skip, an operator's retry,
// an ignored reply, or one of the saga's own events.
type mark struct {
	at    time.Time
	kind  string
	tip   string
	label string // written beside the mark; "" for none
}

type rowKey struct {
	index int
	phase saga.Phase
}

// row is one step's action, or one step's compensation, or the saga's own
// events (index -1).
type row struct {
	key   rowKey
	label string
	group string
	segs  []segment
	marks []mark
}

// open returns the segment of r still open, or nil.
func (r *row) open() *segment {
	if n := len(r.segs); n > 0 && r.segs[n-1].to.IsZero() {
		return &r.segs[n-1]
	}
	return nil
}

// close ends r's open segment at t with outcome, and reports whether one
// was open.
func (r *row) close(t time.Time, outcome string) bool {
	s := r.open()
	if s == nil {
		return false
	}
	s.to, s.outcome = t, outcome
	return true
}

// timeline is the rows of a saga's history.
type timeline struct {
	inst  saga.Instance
	rows  []*row
	index map[rowKey]*row
	saga  *row
	t0    time.Time
	tEnd  time.Time
}

// TimelineSVG draws the run of saga inst from its history hist (as
// orchestrator.Client.History returns it, oldest first) as a Gantt-like
// SVG timeline: one row per step's action and one per compensation sent,
// in the order they began, each with a bar per attempt from the command
// sent to the reply applied (or the timeout, the rejection, the re-send);
// a dashed line is the backoff before a retry, a pale bar a wait for an
// outside event, a dashed bar what is still in flight. Local steps, skipped
// steps, operator retries and ignored replies are marks on their step's
// row; the saga's own events (started, group joined, cancelled, restarted,
// its end) are marks on the first row. Each row is a <g class="row"> with
// data-step and data-phase attributes; each bar a <rect class="bar …">
// with data-attempt.
func TimelineSVG(inst saga.Instance, hist []saga.HistoryEntry, opts *TimelineOpts) string {
	tl := &timeline{inst: inst, index: map[rowKey]*row{}}
	tl.saga = &row{key: rowKey{index: -1}, label: "saga"}
	tl.rows = append(tl.rows, tl.saga)
	for _, e := range hist {
		tl.apply(e)
	}
	if len(hist) > 0 {
		tl.t0, tl.tEnd = hist[0].At, hist[0].At
		for _, e := range hist {
			if e.At.Before(tl.t0) {
				tl.t0 = e.At
			}
			if e.At.After(tl.tEnd) {
				tl.tEnd = e.At
			}
		}
	}
	if opts != nil && opts.Now.After(tl.tEnd) && !inst.Status.Terminal() {
		tl.tEnd = opts.Now
	}
	for _, r := range tl.rows {
		r.close(tl.tEnd, "open")
	}
	return tl.draw(hist)
}

// row returns the row of step index in phase, created if need be.
func (tl *timeline) row(e saga.HistoryEntry, phase saga.Phase) *row {
	k := rowKey{e.StepIndex, phase}
	if r, ok := tl.index[k]; ok {
		return r
	}
	name, group := e.Step, ""
	if e.StepIndex >= 0 && e.StepIndex < len(tl.inst.Steps) {
		name, group = tl.inst.Steps[e.StepIndex].Name, tl.inst.Steps[e.StepIndex].Group
	}
	r := &row{key: k, label: name, group: group}
	if phase == saga.PhaseCompensation {
		r.label = "↩ " + name
	}
	tl.index[k] = r
	tl.rows = append(tl.rows, r)
	return r
}

// apply adds history entry e to the rows.
func (tl *timeline) apply(e saga.HistoryEntry) {
	at := e.At
	tip := string(e.Event)
	if e.Step != "" {
		tip += " " + e.Step
	}
	if e.Attempt > 0 {
		tip += fmt.Sprintf(" (attempt %d)", e.Attempt)
	}
	if e.Detail != "" {
		tip += ": " + e.Detail
	}
	if e.Actor != "" {
		tip += " by " + e.Actor
	}
	action := func() *row { return tl.row(e, saga.PhaseAction) }
	comp := func() *row { return tl.row(e, saga.PhaseCompensation) }
	switch e.Event {
	case saga.HistoryCommandSent:
		r := action()
		if s := r.open(); s != nil && s.kind == "backoff" {
			r.close(at, "ok")
		} else {
			r.close(at, "superseded")
		}
		r.segs = append(r.segs, segment{kind: "attempt", from: at, attempt: e.Attempt, detail: e.Detail})
	case saga.HistoryReplyApplied:
		if r := action(); !r.close(at, "ok") {
			r.marks = append(r.marks, mark{at: at, kind: "reply", tip: tip})
		}
	case saga.HistoryStepRejected:
		r := action()
		if s := r.open(); s != nil {
			s.detail = joinDetail(s.detail, e.Detail)
			r.close(at, "rejected")
		} else {
			r.marks = append(r.marks, mark{at: at, kind: "rejected", tip: tip})
		}
	case saga.HistoryTimedOut:
		r := action()
		if e.Phase == saga.PhaseCompensation {
			r = comp()
		}
		if !r.close(at, "timed-out") {
			r.marks = append(r.marks, mark{at: at, kind: "rejected", tip: tip})
		}
	case saga.HistoryRetryScheduled:
		r := action()
		r.close(at, "timed-out")
		r.segs = append(r.segs, segment{kind: "backoff", from: at, attempt: e.Attempt, detail: e.Detail})
	case saga.HistoryEventAwaited:
		r := action()
		r.close(at, "superseded")
		r.segs = append(r.segs, segment{kind: "wait", from: at, detail: "waiting for event " + e.Detail})
	case saga.HistoryEventReceived:
		if r := action(); !r.close(at, "ok") {
			r.marks = append(r.marks, mark{at: at, kind: "reply", tip: tip})
		}
	case saga.HistoryCompensationSent:
		if r, ok := tl.index[rowKey{e.StepIndex, saga.PhaseAction}]; ok {
			r.close(at, "abandoned") // given up on while in flight
		}
		r := comp()
		r.close(at, "superseded")
		r.segs = append(r.segs, segment{kind: "compensation", from: at, attempt: e.Attempt, detail: e.Detail})
	case saga.HistoryStepCompensated:
		if r := comp(); !r.close(at, "ok") {
			r.marks = append(r.marks, mark{at: at, kind: "reply", tip: tip})
		}
	case saga.HistoryCompensationFailed:
		r := comp()
		if s := r.open(); s != nil {
			s.detail = joinDetail(s.detail, e.Detail)
		}
		if !r.close(at, "failed") {
			r.marks = append(r.marks, mark{at: at, kind: "rejected", tip: tip})
		}
	case saga.HistoryCompensationSkipped:
		action().marks = append(action().marks, mark{at: at, kind: "skipped", tip: tip + " (nothing to compensate)"})
	case saga.HistoryLocalStepSucceeded:
		action().marks = append(action().marks, mark{at: at, kind: "local", tip: tip})
	case saga.HistoryStepSkipped:
		action().marks = append(action().marks, mark{at: at, kind: "skipped", tip: tip})
	case saga.HistoryRetried:
		r := action()
		if e.Phase == saga.PhaseCompensation {
			r = comp()
		}
		r.marks = append(r.marks, mark{at: at, kind: "operator", tip: tip})
	case saga.HistoryReplyIgnored:
		r := tl.saga
		for _, ph := range []saga.Phase{e.Phase, saga.PhaseAction} {
			if x, ok := tl.index[rowKey{e.StepIndex, ph}]; ok {
				r = x
				break
			}
		}
		r.marks = append(r.marks, mark{at: at, kind: "ignored", tip: tip})
	case saga.HistoryCancelled, saga.HistoryAborted, saga.HistoryTerminated, saga.HistoryRestarted:
		outcome := map[saga.HistoryEvent]string{saga.HistoryTerminated: "terminated", saga.HistoryRestarted: "superseded"}[e.Event]
		for _, r := range tl.rows {
			if outcome == "" && r.key.phase == saga.PhaseCompensation {
				continue // a cancel ends actions; their compensations follow
			}
			o := outcome
			if o == "" {
				o = "cancelled"
			}
			r.close(at, o)
		}
		tl.saga.marks = append(tl.saga.marks, mark{at: at, kind: "operator", tip: tip, label: string(e.Event)})
	case saga.HistoryCompleted, saga.HistoryCompensated, saga.HistoryFailed:
		tl.saga.marks = append(tl.saga.marks, mark{at: at, kind: string(e.Event), tip: tip, label: string(e.Event)})
	default: // started, group-joined and the orchestrator's own entries
		tl.saga.marks = append(tl.saga.marks, mark{at: at, kind: "saga", tip: tip})
	}
}

func joinDetail(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + ": " + b
}

// x is the abscissa of t.
func (tl *timeline) x(t time.Time) float64 {
	span := tl.tEnd.Sub(tl.t0)
	if span <= 0 {
		return tlLabelW
	}
	return tlLabelW + float64(t.Sub(tl.t0))/float64(span)*tlPlotW
}

// barLook is the fill, stroke and dash of a bar.
func barLook(s segment) (fill, stroke, dash string) {
	switch s.kind {
	case "wait":
		fill, stroke = "#e0e7ff", "#6366f1"
	case "compensation":
		fill, stroke = "#f59e0b", "#b45309"
	default:
		fill, stroke = "#3b82f6", "#1d4ed8"
	}
	switch s.outcome {
	case "rejected", "failed":
		fill, stroke = "#ef4444", "#b91c1c"
	case "timed-out":
		fill, stroke = "#fb923c", "#c2410c"
		if s.kind == "wait" {
			fill = "#fed7aa"
		}
	case "superseded", "abandoned", "cancelled":
		fill, stroke = "#d1d5db", "#6b7280"
	case "terminated":
		fill, stroke = "#6b7280", "#374151"
	case "open":
		dash = "4 2"
		switch s.kind {
		case "compensation":
			fill = "#fde68a"
		case "attempt":
			fill = "#bfdbfe"
		}
	}
	return fill, stroke, dash
}

// draw returns the picture.
func (tl *timeline) draw(hist []saga.HistoryEntry) string {
	var body svgWriter
	width := tlLabelW + tlPlotW + tlRightW
	height := tlTop + float64(len(tl.rows))*tlRowH + tlLegendH
	title := fmt.Sprintf("%s v%d · saga %s · %s", tl.inst.Type, tl.inst.Version, tl.inst.ID, tl.inst.Status)
	if !tl.t0.IsZero() {
		title += " · started " + tl.t0.UTC().Format("2006-01-02 15:04:05.000 UTC")
	}
	body.text(12, 22, "start", titlePx, "600", "#111827", fit(title, width-24, titlePx, true))

	// The axis: offsets from the start, and a grid line at each.
	span := tl.tEnd.Sub(tl.t0)
	bottom := tlTop + float64(len(tl.rows))*tlRowH
	if len(hist) > 0 {
		step := niceStep(span / 6)
		for off := time.Duration(0); off <= span; off += step {
			x := tl.x(tl.t0.Add(off))
			body.raw(`<line class="tick" x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e5e7eb"/>`+"\n", num(x), num(tlTop-8), num(x), num(bottom))
			label := "+" + duration(off)
			if off == 0 {
				label = "0"
			}
			body.text(x, tlTop-14, "middle", 10, "", "#6b7280", label)
			if span <= 0 {
				break
			}
		}
	} else {
		body.text(tlLabelW, tlTop+tlRowH-8, "start", detailPx, "", "#6b7280", "no history")
	}

	for i, r := range tl.rows {
		y := tlTop + float64(i)*tlRowH
		fill := "#ffffff"
		if i%2 == 1 {
			fill = "#f9fafb"
		}
		body.raw(`<g class="row" data-step="%s" data-phase="%s">`+"\n", xmlText(stepOf(r)), xmlText(phaseOf(r)))
		body.raw(`<rect class="stripe" x="0" y="%s" width="%s" height="%s" fill="%s"/>`+"\n", num(y), num(width), num(tlRowH), fill)
		label := r.label
		if r.key.index < 0 {
			label = "saga"
		}
		weight, colour := "", "#111827"
		if r.key.phase == saga.PhaseCompensation {
			colour = "#92400e"
		}
		if r.key.index < 0 {
			weight, colour = "600", "#374151"
		}
		room := tlLabelW - 24
		if r.group != "" {
			body.text(tlLabelW-12, y+tlRowH/2+4, "end", 9, "", "#6b7280", fit(r.group, 70, 9, false))
			room -= 76
		}
		body.text(12, y+tlRowH/2+4, "start", 12, weight, colour, fit(label, room, 12, weight != ""))
		mid := y + tlRowH/2
		var last time.Time
		right := 0.0 // the right end of what the row draws
		for _, s := range r.segs {
			tl.bar(&body, r, s, y, mid)
			if s.to.After(last) {
				last = s.to
			}
			right = max(right, tl.x(s.to), tl.x(s.from)+3)
		}
		for _, m := range r.marks {
			tl.mark(&body, m, mid)
			right = max(right, tl.x(m.at)+5)
		}
		if attempts, first := count(r), firstStart(r); !first.IsZero() && r.key.index >= 0 {
			note := brief(last.Sub(first))
			if attempts > 1 {
				note += fmt.Sprintf(" · %d attempts", attempts)
			}
			body.text(right+6, mid+4, "start", 10, "", "#4b5563", note)
		}
		body.raw("</g>\n")
	}
	tl.legend(&body, bottom+24)

	var out svgWriter
	out.raw(`<svg xmlns="http://www.w3.org/2000/svg" class="sagapic sagapic-timeline" width="%s" height="%s" viewBox="0 0 %s %s" font-family="%s" role="img" aria-label="%s">`+"\n",
		num(width), num(height), num(width), num(height), xmlText(fontFamily), xmlText("timeline of saga "+tl.inst.ID.String()))
	out.raw("<title>%s</title>\n", xmlText(title))
	out.raw(`<rect class="background" width="%s" height="%s" fill="#ffffff"/>`+"\n", num(width), num(height))
	out.b.WriteString(body.b.String())
	out.raw("</svg>\n")
	return out.b.String()
}

// bar draws segment s of row r, whose top is y and middle mid.
func (tl *timeline) bar(w *svgWriter, r *row, s segment, y, mid float64) {
	x1, x2 := tl.x(s.from), tl.x(s.to)
	what := map[string]string{"attempt": "attempt", "wait": "wait", "compensation": "compensation", "backoff": "backoff before attempt"}[s.kind]
	tip := fmt.Sprintf("%s: %s", strings.TrimPrefix(r.label, "↩ "), what)
	if s.attempt > 0 {
		tip += fmt.Sprintf(" %d", s.attempt)
	}
	if s.detail != "" {
		tip += " (" + s.detail + ")"
	}
	tip += fmt.Sprintf(", from +%s to +%s (%s): %s", duration(s.from.Sub(tl.t0)), duration(s.to.Sub(tl.t0)), duration(s.to.Sub(s.from)), s.outcome)
	if s.kind == "backoff" {
		w.raw(`<line class="bar backoff %s" data-attempt="%d" x1="%s" y1="%s" x2="%s" y2="%s" stroke="#6b7280" stroke-width="1.5" stroke-dasharray="3 3"><title>%s</title></line>`+"\n",
			s.outcome, s.attempt, num(x1), num(mid), num(max(x2, x1+1)), num(mid), xmlText(tip))
		return
	}
	fill, stroke, dash := barLook(s)
	bw := max(x2-x1, 3)
	w.raw(`<rect class="bar %s %s" data-attempt="%d" x="%s" y="%s" width="%s" height="%s" rx="3" fill="%s" stroke="%s"`,
		s.kind, s.outcome, s.attempt, num(x1), num(y+(tlRowH-tlBarH)/2), num(bw), num(tlBarH), fill, stroke)
	if dash != "" {
		w.raw(` stroke-dasharray="%s"`, dash)
	}
	w.raw("><title>%s</title></rect>\n", xmlText(tip))
	if s.outcome == "timed-out" || s.outcome == "rejected" || s.outcome == "failed" {
		w.raw(`<rect class="end %s" x="%s" y="%s" width="2.5" height="%s" fill="#b91c1c"/>`+"\n", s.outcome, num(x1+bw-1.5), num(mid-tlBarH/2-3), num(tlBarH+6))
	}
}

// mark draws m on a row whose middle is mid.
func (tl *timeline) mark(w *svgWriter, m mark, mid float64) {
	x := tl.x(m.at)
	fill := map[string]string{
		"local": "#7c3aed", "skipped": "#ffffff", "ignored": "#9ca3af", "operator": "#2563eb", "reply": "#16a34a",
		"rejected": "#dc2626", "completed": "#16a34a", "compensated": "#d97706", "failed": "#dc2626", "saga": "#374151",
	}[m.kind]
	if fill == "" {
		fill = "#374151"
	}
	w.raw(`<path class="mark %s" d="M%s %sl5 5l-5 5l-5 -5z" fill="%s" stroke="#374151" stroke-width="0.8"><title>%s</title></path>`+"\n",
		xmlText(m.kind), num(x), num(mid-5), fill, xmlText(m.tip))
	if m.label != "" {
		w.text(x+8, mid+4, "start", 10, "600", "#374151", fit(m.label, tlRightW+tlPlotW-(x-tlLabelW)-12, 10, true))
	}
}

// legend explains the bars at y.
func (tl *timeline) legend(w *svgWriter, y float64) {
	items := []struct {
		label string
		s     segment
	}{
		{"attempt (command sent → reply applied)", segment{kind: "attempt", outcome: "ok"}},
		{"waiting for an event", segment{kind: "wait", outcome: "ok"}},
		{"compensation", segment{kind: "compensation", outcome: "ok"}},
		{"timed out", segment{kind: "attempt", outcome: "timed-out"}},
		{"rejected / failed", segment{kind: "attempt", outcome: "rejected"}},
		{"in flight", segment{kind: "attempt", outcome: "open"}},
	}
	x := 12.0
	for _, it := range items {
		fill, stroke, dash := barLook(it.s)
		w.raw(`<rect x="%s" y="%s" width="18" height="10" rx="2" fill="%s" stroke="%s"`, num(x), num(y-9), fill, stroke)
		if dash != "" {
			w.raw(` stroke-dasharray="%s"`, dash)
		}
		w.raw("/>")
		w.text(x+24, y, "start", 10, "", "#4b5563", it.label)
		x += 24 + textWidth(it.label, 10, false) + 18
	}
	w.raw(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#6b7280" stroke-width="1.5" stroke-dasharray="3 3"/>`, num(x), num(y-4), num(x+18), num(y-4))
	w.text(x+24, y, "start", 10, "", "#4b5563", "backoff before a retry")
	w.raw("\n")
}

func stepOf(r *row) string {
	if r.key.index < 0 {
		return ""
	}
	return strings.TrimPrefix(r.label, "↩ ")
}

func phaseOf(r *row) string {
	if r.key.index < 0 {
		return "saga"
	}
	return string(r.key.phase)
}

// count is the number of attempts (or compensation attempts) drawn in r.
func count(r *row) int {
	n := 0
	for _, s := range r.segs {
		if s.kind == "attempt" || s.kind == "compensation" {
			n++
		}
	}
	return n
}

func firstStart(r *row) time.Time {
	if len(r.segs) == 0 {
		return time.Time{}
	}
	return r.segs[0].from
}

// brief writes d to about three significant digits: 87.9ms, 2.6s.
func brief(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return duration(d.Round(time.Microsecond))
	case d < 10*time.Millisecond:
		return duration(d.Round(100 * time.Microsecond))
	case d < time.Second:
		return duration(d.Round(time.Millisecond))
	case d < time.Minute:
		return duration(d.Round(10 * time.Millisecond))
	}
	return duration(d.Round(time.Second))
}

// niceStep returns a round duration of at least d, for the axis's ticks.
func niceStep(d time.Duration) time.Duration {
	for _, s := range []time.Duration{
		time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond,
		50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
		time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
		time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
	} {
		if s >= d {
			return s
		}
	}
	days := (d + 24*time.Hour - 1) / (24 * time.Hour)
	return days * 24 * time.Hour
}
