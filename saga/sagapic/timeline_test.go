package sagapic_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/saga/sagapic"
	"github.com/sagabox/sagabox/saga/sagatest"
)

func TestTimelineGoldenFiles(t *testing.T) {
	t.Parallel()
	done := compensatedRun(t)
	golden(t, "timeline.svg", sagapic.TimelineSVG(done.Instance(), done.History(), nil))
	waiting := waitingRun(t)
	golden(t, "timeline-waiting.svg", sagapic.TimelineSVG(waiting.Instance(), waiting.History(),
		&sagapic.TimelineOpts{Now: waiting.Now().Add(20 * time.Second)}))
}

// rowsOf returns the timeline's rows as "phase step" with their bars'
// classes.
func rowsOf(t *testing.T, els []element) (rows []string, bars map[string][]string) {
	t.Helper()
	bars = map[string][]string{}
	cur := ""
	for _, e := range els {
		switch {
		case e.name == "g" && hasClass(e, "row"):
			cur = e.attrs["data-phase"] + " " + e.attrs["data-step"]
			rows = append(rows, cur)
		case (e.name == "rect" || e.name == "line") && hasClass(e, "bar"):
			bars[cur] = append(bars[cur], e.attrs["class"]+" #"+e.attrs["data-attempt"])
		}
	}
	return rows, bars
}

// One row per step reached and per compensation sent, in the order they
// began; a bar per attempt with its outcome, the backoff between them.
func TestTimelineDrawsAttemptsRetriesWaitsAndCompensations(t *testing.T) {
	t.Parallel()
	s := compensatedRun(t)
	els := parseSVG(t, sagapic.TimelineSVG(s.Instance(), s.History(), nil))
	requireSafeSVG(t, els)
	require.True(t, hasClass(els[0], "sagapic-timeline"))
	rows, bars := rowsOf(t, els)
	require.Equal(t, []string{
		"saga ", "action reserve", "action charge", "action notify", "action await-confirmation", "action mark-paid",
		"action ship", "compensation charge", "compensation reserve",
	}, rows)
	require.Equal(t, []string{"bar attempt timed-out #1", "bar backoff ok #2", "bar attempt ok #2"}, bars["action reserve"],
		"the first attempt timed out; the second, after a backoff, succeeded")
	require.Equal(t, []string{"bar attempt ok #1"}, bars["action charge"])
	require.Equal(t, []string{"bar attempt ok #1"}, bars["action notify"])
	require.Equal(t, []string{"bar wait ok #0"}, bars["action await-confirmation"])
	require.Empty(t, bars["action mark-paid"], "a local step is a mark, not a bar")
	require.Equal(t, []string{"bar attempt rejected #1"}, bars["action ship"])
	require.Equal(t, []string{"bar compensation ok #1"}, bars["compensation charge"])
	require.Equal(t, []string{"bar compensation ok #1"}, bars["compensation reserve"])

	marks := map[string]int{}
	for _, e := range find(els, "path", "mark") {
		marks[strings.TrimPrefix(e.attrs["class"], "mark ")]++
	}
	require.Equal(t, 1, marks["local"], "mark-paid ran")
	require.Equal(t, 2, marks["skipped"], "mark-paid and notify had nothing to compensate")
	require.Equal(t, 1, marks["compensated"], "the saga's end")

	// Bars start where their command was sent: the charge and notify
	// bars begin together, the second reserve attempt after the first.
	start := map[string]float64{}
	for _, e := range find(els, "rect", "bar") {
		key := e.attrs["class"] + e.attrs["data-attempt"]
		if _, ok := start[key]; !ok {
			start[key] = atof(t, e.attrs["x"])
		}
	}
	require.Less(t, start["bar attempt timed-out1"], start["bar attempt ok2"])
	text := allText(els)
	require.Contains(t, text, "2 attempts", "the reserve row counts its attempts")
	require.Contains(t, text, "shop v2 · saga "+s.ID().String()+" · compensated")
}

// A saga still in flight: its open bar runs to Now, dashed.
func TestTimelineShowsWhatIsInFlight(t *testing.T) {
	t.Parallel()
	s := waitingRun(t)
	now := s.Now().Add(time.Minute)
	els := parseSVG(t, sagapic.TimelineSVG(s.Instance(), s.History(), &sagapic.TimelineOpts{Now: now}))
	_, bars := rowsOf(t, els)
	require.Equal(t, []string{"bar wait open #0"}, bars["action await-confirmation"])
	open := find(els, "rect", "open")
	require.Len(t, open, 1)
	require.Equal(t, "4 2", open[0].attrs["stroke-dasharray"])
	x, w := atof(t, open[0].attrs["x"]), atof(t, open[0].attrs["width"])
	require.InDelta(t, 210+640, x+w, 0.2, "the open bar ends at Now, the right end of the axis")

	// An operator's retry and a cancel: the retried attempt is superseded,
	// the cancelled one ends at the cancel, the compensation follows.
	r := sagatest.New(t, shop())
	r.Start(Order{ID: "o-3"})
	sagatest.ExpectCommand(r, reserve)
	r.Advance(5 * time.Second)
	r.Retry("alice", "stuck")
	sagatest.ExpectCommand(r, reserve)
	r.Advance(5 * time.Second)
	r.Cancel("bob", "customer called")
	sagatest.ExpectCompensation(r, release)
	els = parseSVG(t, sagapic.TimelineSVG(r.Instance(), r.History(), &sagapic.TimelineOpts{Now: r.Now().Add(time.Second)}))
	_, bars = rowsOf(t, els)
	require.Equal(t, []string{"bar attempt superseded #1", "bar attempt cancelled #2"}, bars["action reserve"])
	require.Equal(t, []string{"bar compensation open #1"}, bars["compensation reserve"])
	require.Contains(t, allText(els), "cancelled")
}

// Details, actors and names are the users': escaped like the graph's.
func TestTimelineEscapesHostileText(t *testing.T) {
	t.Parallel()
	at := sagatest.Epoch
	evil := `<script>alert(1)</script>`
	inst := saga.Instance{ID: uuid.New(), Type: `"><svg onload=alert(1)>`, Version: 1, Status: saga.StatusRunning,
		Steps: []saga.StepState{{Name: evil, Status: saga.StepRunning}}}
	hist := []saga.HistoryEntry{
		{At: at, Event: saga.HistoryStarted, StepIndex: -1, Detail: evil},
		{At: at, Event: saga.HistoryCommandSent, Step: evil, StepIndex: 0, Attempt: 1, Detail: `a&b "c" 'd'`},
		{At: at.Add(time.Second), Event: saga.HistoryRetried, Step: evil, StepIndex: 0, Actor: "<b>eve</b>\x00", Detail: "]]>"},
		{At: at.Add(2 * time.Second), Event: saga.HistoryReplyIgnored, Step: "other<", StepIndex: 7, Detail: evil},
		{At: at.Add(3 * time.Second), Event: "from-a-later-version", StepIndex: -1, Detail: evil},
	}
	svg := sagapic.TimelineSVG(inst, hist, nil)
	els := parseSVG(t, svg)
	requireSafeSVG(t, els)
	require.NotContains(t, svg, "<script")
	require.NotContains(t, svg, "<svg onload")
	require.NotContains(t, svg, "<b>")
	rows, _ := rowsOf(t, els)
	require.Equal(t, []string{"saga ", "action " + evil}, rows, "an ignored reply to an unknown step makes no row")
}

// Odd histories draw, not fail: none at all, one instant, entries out of
// step with the instance.
func TestTimelineDrawsOddHistories(t *testing.T) {
	t.Parallel()
	inst := saga.Instance{ID: uuid.New(), Type: "x", Version: 1, Status: saga.StatusQueued}
	require.Contains(t, allText(parseSVG(t, sagapic.TimelineSVG(inst, nil, nil))), "no history")
	at := sagatest.Epoch
	one := []saga.HistoryEntry{{At: at, Event: saga.HistoryStarted, StepIndex: -1}}
	parseSVG(t, sagapic.TimelineSVG(inst, one, &sagapic.TimelineOpts{Now: at}))
	stray := []saga.HistoryEntry{
		{At: at, Event: saga.HistoryReplyApplied, Step: "ghost", StepIndex: 9},
		{At: at.Add(time.Hour), Event: saga.HistoryStepCompensated, Step: "ghost", StepIndex: 9, Phase: saga.PhaseCompensation},
	}
	rows, _ := rowsOf(t, parseSVG(t, sagapic.TimelineSVG(inst, stray, nil)))
	require.Equal(t, []string{"saga ", "action ghost", "compensation ghost"}, rows)
}
