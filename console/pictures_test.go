package console_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/console"
	"github.com/sagabox/sagabox/internal/testkit"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/participant"
	"github.com/sagabox/sagabox/saga"
)

// picturesEnv names the directory (relative to the repository root) the
// pictures test saves its screenshots to: saga-graph.png and
// saga-timeline.png. Unset, none is written.
const picturesEnv = "SAGAPIC_SCREENSHOTS"

type Payment struct {
	Reference string `json:"reference"`
}

var (
	Notify     = saga.NewCommand[OrderRef, saga.None]("mail.notify")
	CancelShip = saga.NewCommand[OrderRef, saga.None]("shipping.cancel")
	Paid       = saga.NewEventType[Payment]("payment.confirmed")
)

// shop is the saga of the pictures: a step with retries, a parallel group,
// a wait for an outside event, a local step and a last step that a bad
// address makes shipping reject.
func shop() *saga.Definition[Order] {
	return saga.MustNew("shop", 1,
		saga.Step("reserve", saga.Invoke(Reserve, ref, nil), saga.Compensate(Release, ref),
			saga.WithTimeout[Order](2*time.Second), saga.WithRetry[Order](saga.RetryPolicy{MaxAttempts: 3, InitialInterval: 500 * time.Millisecond})),
		saga.Parallel("pay-and-notify",
			saga.Step("charge", saga.Invoke(Charge, ref, nil), saga.Compensate(Refund, ref), saga.WithTimeout[Order](time.Minute)),
			saga.Step("notify", saga.Invoke(Notify, ref, nil), saga.WithTimeout[Order](time.Minute)),
		),
		saga.WaitEvent("await-payment", Paid, nil, saga.WithTimeout[Order](time.Hour)),
		saga.LocalStep("mark-paid", func(context.Context, *Order) error { return nil }),
		saga.Step("ship", saga.Invoke(Ship, func(o *Order) ShipReq { return ShipReq{OrderID: o.ID, Address: o.Address} }, nil),
			saga.Compensate(CancelShip, ref), saga.WithTimeout[Order](time.Minute)),
	)
}

// The saga page of a saga whose definition no orchestrator recorded says
// so, and still draws its timeline, without a style attribute the page's
// policy would drop.
func TestSagaPageWithoutRecordedShape(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	orch := w.orchestrator(nil) // never runs, so records nothing
	st := w.start(orch, holding(), Order{ID: "o-1"}, "order-1")
	h, err := console.New(console.Config{Pool: w.pool, Schema: w.orch.Store.Schema()})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/sagas/" + st.ID.String())
	require.NoError(t, err)
	body := readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "style-src 'self'; script-src 'none'", "the policy stays strict")
	require.Contains(t, body, `id="graph-note"`)
	require.Contains(t, body, "No shape of holding v2 is recorded in schema "+w.orch.Store.Schema())
	require.Contains(t, body, `class="sagapic sagapic-timeline"`)
	require.Contains(t, body, `data-step="reserve" data-phase="action"`)
	require.NotContains(t, body, " style=", "no inline style: the policy allows none")
	require.NotContains(t, body, "<style")
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return string(b)
}

// TestSagaPicturesInBrowser loads, in headless Chromium under the console's
// own Content-Security-Policy, the pages of two sagas of the shop saga run
// by a real orchestrator and participant: one waiting for its payment (the
// graph highlights that step, the steps before it succeeded) and one
// compensated after shipping rejected it (the timeline shows reserve's
// timed-out first attempt, its backoff and its second attempt, the group's
// branches side by side in time, and the compensations in reverse order).
// The browser reports no policy violation. With SAGAPIC_SCREENSHOTS set it
// saves the graph and the timeline for the docs.
func TestSagaPicturesInBrowser(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	broker := w.broker()
	orch, err := orchestrator.NewClient(orchestrator.Config{
		Pool: w.pool, Schema: w.orch.Store.Schema(), Service: "orders", Broker: broker,
		Definitions: []saga.Runner{shop()}, SweepInterval: 50 * time.Millisecond, StopTimeout: 10 * time.Second,
		Relay:  orchestrator.RelayConfig{PollInterval: 200 * time.Millisecond},
		Logger: slog.New(slog.DiscardHandler), TracerProvider: w.tracer,
	})
	require.NoError(t, err)
	// The first attempt of reserve for order o-1 is held until the
	// orchestrator has re-sent it: its reply comes late, and the retry is
	// in the timeline.
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	svc, err := participant.NewClient(participant.Config{
		Pool: w.pool, Schema: w.svc.Store.Schema(), Service: "warehouse", Broker: broker, Workers: 2,
		Retry:  saga.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaxAttempts: 1},
		Relay:  participant.RelayConfig{PollInterval: 200 * time.Millisecond},
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	ok := func(context.Context, pgx.Tx, *participant.Request[OrderRef]) (saga.None, error) {
		return saga.None{}, nil
	}
	undo := func(context.Context, pgx.Tx, *participant.Request[OrderRef]) error { return nil }
	participant.HandleCommand(svc, Reserve, func(ctx context.Context, _ pgx.Tx, req *participant.Request[OrderRef]) (saga.None, error) {
		if req.Data.OrderID == "o-1" && req.Attempt == 1 {
			select {
			case <-release:
			case <-ctx.Done():
				return saga.None{}, ctx.Err()
			}
		}
		return saga.None{}, nil
	})
	participant.HandleCompensation(svc, Release, undo)
	participant.HandleCommand(svc, Charge, ok)
	participant.HandleCompensation(svc, Refund, undo)
	participant.HandleCommand(svc, Notify, ok)
	participant.HandleCommand(svc, Ship, func(_ context.Context, _ pgx.Tx, req *participant.Request[ShipReq]) (saga.None, error) {
		if req.Data.Address == nowhere {
			return saga.None{}, participant.Reject(errors.New("no courier goes there"))
		}
		return saga.None{}, nil
	})
	participant.HandleCompensation(svc, CancelShip, undo)
	testkit.Run(t, orch.Run)
	testkit.Run(t, svc.Run)

	compensated := w.start(orch, shop(), Order{ID: "o-1", Address: nowhere}, "o-1")
	waiting := w.start(orch, shop(), Order{ID: "o-2", Address: "1 Main St"}, "o-2")
	testkit.WaitFor(t, 60*time.Second, "reserve's second attempt of o-1", func() bool {
		return sent(t, orch, compensated, "reserve", 2)
	})
	releaseOnce.Do(func() { close(release) })
	for _, st := range []*orchestrator.Started{compensated, waiting} {
		testkit.WaitFor(t, 60*time.Second, "saga "+st.ID.String()+" to wait for its payment", func() bool {
			s, err := orch.Get(context.Background(), st.ID)
			require.NoError(t, err)
			require.Equal(t, saga.StatusRunning, s.Status, s.LastError)
			return s.CurrentStep == 3 && s.Steps[3].Status == saga.StepWaitingEvent
		})
	}
	tx, err := w.pool.Begin(context.Background())
	require.NoError(t, err)
	_, err = orchestrator.SendEvent(context.Background(), orch, tx, orchestrator.SagaRef{ID: compensated.ID}, Paid, "pay-1", Payment{Reference: "r-1"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(context.Background()))
	waitStatus(t, orch, compensated, saga.StatusCompensated)

	h, err := console.New(console.Config{Pool: w.pool, Schema: w.orch.Store.Schema(), MessagingSchemas: []string{w.svc.Store.Schema()}})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	// A tab of its own, under the pages' policy (the other tests' bypasses
	// it), that collects what the browser logs.
	tab, cancel := chromedp.NewContext(browser(t))
	t.Cleanup(cancel)
	var mu sync.Mutex
	var logged []string
	require.NoError(t, chromedp.Listen(tab, func(ev any) {
		if e, ok := ev.(*cdplog.EventEntryAdded); ok {
			mu.Lock()
			logged = append(logged, string(e.Entry.Source)+": "+e.Entry.Text)
			mu.Unlock()
		}
	}))
	_, err = chromedp.Call(tab, cdplog.Enable, cdp.Empty{})
	require.NoError(t, err, "enable the log domain")
	violations := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, l := range logged {
			if strings.Contains(l, "Content Security Policy") {
				out = append(out, l)
			}
		}
		return out
	}

	// The check can see a violation: a page with the console's policy and
	// an inline style.
	policy := srv.Client()
	resp, err := policy.Get(srv.URL + "/sagas")
	require.NoError(t, err)
	csp := resp.Header.Get("Content-Security-Policy")
	readAll(t, resp)
	bad := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Security-Policy", csp)
		_, _ = rw.Write([]byte(`<!doctype html><p style="color: red">inline</p>`))
	}))
	t.Cleanup(bad.Close)
	do(t, tab, chromedp.Navigate(bad.URL))
	testkit.WaitFor(t, 30*time.Second, "the control page's policy violation", func() bool { return len(violations()) > 0 })
	mu.Lock()
	logged = nil
	mu.Unlock()

	t.Run("the graph highlights the step in flight", func(t *testing.T) {
		do(t, tab, chromedp.Navigate(srv.URL+"/sagas/"+waiting.ID.String()), chromedp.WaitVisible(chromedp.CSS("#graph svg.sagapic-graph")))
		require.Equal(t, []string{"reserve", "charge", "notify", "await-payment", "mark-paid", "ship"}, attrs(t, tab, "#graph g.node", "data-step"))
		require.Equal(t, []string{"await-payment"}, attrs(t, tab, "#graph g.node.current", "data-step"), "the current step")
		require.Equal(t, []string{"reserve", "charge", "notify"}, attrs(t, tab, "#graph g.node.done", "data-step"))
		require.Equal(t, []string{"reserve", "charge", "ship"}, attrs(t, tab, "#graph g.compensation", "data-step"))
		require.Positive(t, eval[float64](t, tab, `document.querySelector('#graph g.node.current rect.highlight').getBBox().width`),
			"the highlight is drawn")
		require.NotEmpty(t, attrs(t, tab, "#timeline svg.sagapic-timeline g.row", "data-step"))
		require.Equal(t, []string{"bar wait open"}, attrs(t, tab, `#timeline g.row[data-step="await-payment"] rect.bar`, "class"))
		pictureScreenshot(t, tab, "#graph svg", "saga-graph.png")
	})

	t.Run("the timeline shows attempts, retries and compensations", func(t *testing.T) {
		do(t, tab, chromedp.Navigate(srv.URL+"/sagas/"+compensated.ID.String()), chromedp.WaitVisible(chromedp.CSS("#timeline svg.sagapic-timeline")))
		require.Equal(t, []string{"", "reserve", "charge", "notify", "await-payment", "mark-paid", "ship", "charge", "reserve"},
			attrs(t, tab, "#timeline g.row", "data-step"), "a row per step, then the compensations in reverse order")
		require.Equal(t, []string{"saga", "action", "action", "action", "action", "action", "action", "compensation", "compensation"},
			attrs(t, tab, "#timeline g.row", "data-phase"))
		require.Equal(t, []string{"bar attempt timed-out", "bar backoff ok", "bar attempt ok"},
			attrs(t, tab, `#timeline g.row[data-step="reserve"][data-phase="action"] .bar`, "class"),
			"reserve's first attempt timed out; the second, after the backoff, got the reply")
		require.Equal(t, []string{"mark ignored"}, attrs(t, tab, `#timeline g.row[data-step="reserve"][data-phase="action"] path.mark`, "class"),
			"the barrier answered the second attempt too: that reply came after the first's and was ignored")
		require.Equal(t, []string{"bar attempt rejected"}, attrs(t, tab, `#timeline g.row[data-step="ship"] .bar`, "class"))
		require.Equal(t, []string{"bar compensation ok"}, attrs(t, tab, `#timeline g.row[data-step="charge"][data-phase="compensation"] .bar`, "class"))
		require.Positive(t, eval[float64](t, tab, `document.querySelector('#timeline svg.sagapic-timeline').getBBox().width`))
		require.Empty(t, attrs(t, tab, "#graph g.current", "data-step"), "a compensated saga has no step in flight")
		require.Equal(t, []string{"ship"}, attrs(t, tab, "#graph g.node.failed", "data-step"))
		pictureScreenshot(t, tab, "#timeline svg", "saga-timeline.png")
	})
	require.Empty(t, violations(), "the pictures need nothing the console's policy forbids")
}

// sent reports whether attempt of step's action of saga st was sent.
func sent(t *testing.T, orch *orchestrator.Client, st *orchestrator.Started, step string, attempt int) bool {
	t.Helper()
	hist, err := orch.History(context.Background(), st.ID)
	require.NoError(t, err)
	for _, e := range hist {
		if e.Event == saga.HistoryCommandSent && e.Step == step && e.Attempt == attempt {
			return true
		}
	}
	return false
}

// pictureScreenshot saves the element selector matches to the directory
// picturesEnv names, as name, when the variable is set.
func pictureScreenshot(t *testing.T, tab context.Context, selector, name string) {
	t.Helper()
	dir := os.Getenv(picturesEnv)
	if dir == "" {
		return
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join("..", dir)
	}
	ctx, cancel := context.WithTimeout(tab, 60*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.ScreenshotScale(chromedp.CSS(selector), 1.5))
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("screenshot of %s timed out", selector)
	}
	require.NoError(t, err)
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot saved to %s", path)
}
