package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/console"
	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport"
)

// screenshotEnv names the file (relative to the repository root) the
// browser test saves the timeline's screenshot to; the sagas list goes
// next to it with a "-sagas" suffix. Unset, no screenshot is written.
const screenshotEnv = "CONSOLE_SCREENSHOT"

// chromium returns the path of a Chromium or Chrome binary.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium found: install it with `apt-get install -y chromium` (.ci/run does when it is missing)")
	return ""
}

// browser returns a headless Chromium tab, closed when the test ends.
func browser(t *testing.T) context.Context {
	t.Helper()
	// Chromium makes its singleton socket's directory in TMPDIR and leaves
	// it when it is killed, as cancelAlloc does: in the test's own
	// directory, removed after the browser (cleanups run last first).
	tmp := t.TempDir()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)), chromedp.NoSandbox, chromedp.WindowSize(1400, 1000),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.Env("TMPDIR="+tmp))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	// The first call starts the browser, on the tab's context (a timeout
	// there would stop the browser). The pages' policy allows no script;
	// the tests evaluate their own.
	_, err := chromedp.Call(ctx, page.SetBypassCSP, page.SetBypassCSPParams{Enabled: true})
	require.NoError(t, err, "start Chromium")
	return ctx
}

// do runs steps in the tab, under a generous bound.
func do(t *testing.T, tab context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 60*time.Second)
	defer cancel()
	require.NoError(t, chromedp.Do(ctx, steps...))
}

// eval evaluates expr in the tab's page.
func eval[T any](t *testing.T, tab context.Context, expr string, opts ...chromedp.EvaluateOption) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, opts...))
	require.NoError(t, err, "evaluate %s", expr)
	return v
}

// waitJS polls expr in the tab's page until it is true (a page that is
// being replaced answers with an error, which only means: not yet).
func waitJS(t *testing.T, tab context.Context, what, expr string) {
	t.Helper()
	testkit.WaitFor(t, 60*time.Second, what, func() bool {
		ctx, cancel := context.WithTimeout(tab, 10*time.Second)
		defer cancel()
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("document.readyState === 'complete' && ("+expr+")"))
		return err == nil && ok
	})
}

// attrs returns attribute attr of the elements selector matches, in
// document order.
func attrs(t *testing.T, tab context.Context, selector, attr string) []string {
	t.Helper()
	return eval[[]string](t, tab, `Array.from(document.querySelectorAll(`+quote(selector)+`)).map(e => e.getAttribute(`+quote(attr)+`))`)
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `\'`) + "'" }

// text returns the text of the first element selector matches.
func text(t *testing.T, tab context.Context, selector string) string {
	t.Helper()
	return eval[string](t, tab, `document.querySelector(`+quote(selector)+`).textContent.trim()`)
}

// screenshot saves the page to the file screenshotEnv names, with suffix
// before its extension, when the variable is set.
func screenshot(t *testing.T, tab context.Context, suffix string) {
	t.Helper()
	path := os.Getenv(screenshotEnv)
	if path == "" {
		return
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join("..", path)
	}
	ext := filepath.Ext(path)
	path = strings.TrimSuffix(path, ext) + suffix + ext
	ctx, cancel := context.WithTimeout(tab, 60*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot saved to %s", path)
}

// TestConsoleInBrowser drives the console in headless Chromium against
// real sagas on PostgreSQL and RabbitMQ: the list loads and filters, the
// timeline of a compensated checkout shows its compensations in order
// (refund, then release), an abort through the console's form is applied
// by the orchestrator and appears in the history with its actor, and a
// read-only console refuses the same action.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	tab := browser(t)
	w := newWorld(t)
	broker := w.broker()
	declare, cancel := context.WithTimeout(context.Background(), amqptest.Timeout)
	defer cancel()
	require.NoError(t, broker.Declare(declare, transport.QueueSpec{Name: "blackhole", Commands: []string{Hold.Name()}}))
	orch := w.orchestrator(broker)
	testkit.Run(t, orch.Run)
	testkit.Run(t, w.participant(broker).Run)

	shipped := w.start(orch, checkout(), Order{ID: "o-1", Amount: 10, Address: "1 Main St"}, "order-1")
	returned := w.start(orch, checkout(), Order{ID: "o-2", Amount: 20, Address: nowhere}, "order-2")
	held := w.start(orch, holding(), Order{ID: "o-3"}, "order-3")
	heldToo := w.start(orch, holding(), Order{ID: "o-4"}, "order-4")
	waitStatus(t, orch, shipped, saga.StatusCompleted)
	waitStatus(t, orch, returned, saga.StatusCompensated)
	for _, st := range []*orchestrator.Started{held, heldToo} {
		testkit.WaitFor(t, 60*time.Second, "saga "+st.ID.String()+" to wait on its hold step", func() bool {
			s, err := orch.Get(context.Background(), st.ID)
			require.NoError(t, err)
			return s.CurrentStep == 1
		})
	}

	schema := w.orch.Store.Schema()
	rw, err := console.New(console.Config{
		Pool: w.pool, Schema: schema, MessagingSchemas: []string{w.svc.Store.Schema()}, AllowActions: true,
		ActionWait: 30 * time.Second, Actor: func(*http.Request) string { return "alice" },
	})
	require.NoError(t, err)
	rwSrv := httptest.NewServer(rw)
	t.Cleanup(rwSrv.Close)
	ro, err := console.New(console.Config{Pool: w.pool, Schema: schema})
	require.NoError(t, err)
	roSrv := httptest.NewServer(ro)
	t.Cleanup(roSrv.Close)

	t.Run("the list loads and filters", func(t *testing.T) {
		do(t, tab, chromedp.Navigate(rwSrv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#sagas")))
		require.Equal(t, []string{shipped.ID.String(), returned.ID.String(), held.ID.String(), heldToo.ID.String()},
			attrs(t, tab, "tr.saga", "data-id"), "oldest first")
		screenshot(t, tab, "-sagas")

		do(t, tab, chromedp.SetValue(chromedp.CSS(`input[name=type]`), "checkout"), chromedp.Click(chromedp.CSS("#apply")))
		waitJS(t, tab, "the type filter", `location.search.includes('type=checkout')`)
		require.Equal(t, []string{"checkout", "checkout"}, attrs(t, tab, "tr.saga", "data-type"))

		do(t, tab, chromedp.SetValue(chromedp.CSS(`select[name=status]`), "compensated"), chromedp.Click(chromedp.CSS("#apply")))
		waitJS(t, tab, "the status filter", `location.search.includes('status=compensated')`)
		require.Equal(t, []string{returned.ID.String()}, attrs(t, tab, "tr.saga", "data-id"))
		require.Equal(t, []string{"compensated"}, attrs(t, tab, "tr.saga", "data-status"))

		do(t, tab, chromedp.Navigate(rwSrv.URL+"/sagas?key=order-3&version=2"), chromedp.WaitVisible(chromedp.CSS("#sagas")))
		require.Equal(t, []string{held.ID.String()}, attrs(t, tab, "tr.saga", "data-id"), "by start key and version")
	})

	t.Run("the timeline shows the compensations in order", func(t *testing.T) {
		do(t, tab, chromedp.Navigate(rwSrv.URL+"/sagas"), chromedp.WaitVisible(chromedp.CSS("#sagas")),
			chromedp.Click(chromedp.CSS(`tr.saga[data-id="`+returned.ID.String()+`"] a.id`)))
		waitJS(t, tab, "the saga's page", `!!document.querySelector('#history')`)
		require.Equal(t, "compensated", text(t, tab, "#saga-status"))
		require.Regexp(t, "^[0-9a-f]{32}$", text(t, tab, "#trace-id"), "the saga's trace id")
		require.Equal(t, []string{"charge", "reserve"}, attrs(t, tab, `#history tr[data-event="compensation-sent"]`, "data-step"),
			"refund first, then release")
		require.Equal(t, []string{"charge", "reserve"}, attrs(t, tab, `#history tr[data-event="step-compensated"]`, "data-step"))
		require.ElementsMatch(t, []string{"charge", "reserve"}, attrs(t, tab, `#barrier tr.mark[data-phase="compensation"]`, "data-step"),
			"the participant's barrier decided both compensations")
		screenshot(t, tab, "")
	})

	t.Run("an allowed action is applied and appears in the history", func(t *testing.T) {
		do(t, tab, chromedp.Navigate(rwSrv.URL+"/sagas/"+held.ID.String()), chromedp.WaitVisible(chromedp.CSS("#abort-form")),
			chromedp.SendKeys(chromedp.CSS(`#abort-form input[name=reason]`), "customer cancelled by phone"),
			chromedp.Click(chromedp.CSS(`#abort-form button`)))
		waitJS(t, tab, "the outcome of the abort", `!!document.querySelector('#flash')`)
		require.Contains(t, text(t, tab, "#flash"), "abort applied")
		require.Equal(t, []string{"alice"}, attrs(t, tab, `#history tr.operator[data-event="cancelled"]`, "data-actor"),
			"the abort is in the history with its actor")
		waitStatus(t, orch, held, saga.StatusCompensated)
	})

	t.Run("the outbox page shows each schema's backlog and dead letters", func(t *testing.T) {
		do(t, tab, chromedp.Navigate(rwSrv.URL+"/outbox"), chromedp.WaitVisible(chromedp.CSS("section.schema")))
		require.Equal(t, []string{schema, w.svc.Store.Schema()}, attrs(t, tab, "section.schema", "data-schema"))
		for _, backlog := range eval[[]string](t, tab, `Array.from(document.querySelectorAll('section.schema .backlog')).map(e => e.textContent)`) {
			require.Regexp(t, `^\d+$`, backlog)
		}
	})

	t.Run("a read-only console refuses it", func(t *testing.T) {
		do(t, tab, chromedp.Navigate(roSrv.URL+"/sagas/"+heldToo.ID.String()), chromedp.WaitVisible(chromedp.CSS("#history")))
		require.Equal(t, "read-only", text(t, tab, "#mode"))
		require.Zero(t, eval[int](t, tab, `document.querySelectorAll('form[method=post]').length`), "a read-only console offers no action")
		status := eval[int](t, tab, `fetch(location.pathname + '/abort', {method: 'POST', body: new URLSearchParams({reason: 'sneaky'})}).then(r => r.status)`,
			chromedp.EvalAwaitPromise)
		require.Equal(t, http.StatusForbidden, status)
		require.Zero(t, w.pendingRequests())
		s, err := orch.Get(context.Background(), heldToo.ID)
		require.NoError(t, err)
		require.Equal(t, saga.StatusRunning, s.Status)
	})
}
