package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store"
)

// pageNames are the templates of templates/, each rendered inside
// layout.html.
var pageNames = []string{"sagas", "saga", "outbox", "requests", "error"}

func parsePages(funcs template.FuncMap) (map[string]*template.Template, error) {
	pages := make(map[string]*template.Template, len(pageNames))
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("parse template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

func (c *console) funcs() template.FuncMap {
	return template.FuncMap{
		"path": func(p string) string { return c.cfg.BasePath + p },
		"time": func(t time.Time) string {
			if t.IsZero() {
				return "–"
			}
			return t.UTC().Format("2006-01-02 15:04:05.000")
		},
		"since": func(from, t time.Time) string {
			if t.IsZero() {
				return ""
			}
			return "+" + t.Sub(from).Round(time.Millisecond).String()
		},
		"age": func(d time.Duration) string {
			if d == 0 {
				return "–"
			}
			return d.Round(time.Millisecond).String()
		},
		"dash": func(s string) string {
			if s == "" {
				return "–"
			}
			return s
		},
	}
}

// page is what every template gets.
type page struct {
	Title  string
	Nav    string
	Schema string
	// AllowActions is whether the page offers actions: the console allows
	// them and the user is an operator.
	AllowActions bool
	// ReadOnly is whether the console allows no action at all.
	ReadOnly bool
	// Auth is whether the console authenticates; Who is the user (none on
	// a page that refuses an unauthenticated request).
	Auth bool
	Who  identity
	// Actor is who the actions are recorded as, without authentication.
	Actor string
	CSRF  string
	Flash string
	Data  any
}

// render writes template name with data.
func (c *console) render(w http.ResponseWriter, r *http.Request, status int, name, title string, data any) {
	who := whoOf(r)
	p := page{Title: title, Nav: name, Schema: c.cfg.Schema, AllowActions: c.cfg.AllowActions && who.MayAct(), ReadOnly: !c.cfg.AllowActions,
		Auth: c.auth.on(), Who: who, Data: data, Flash: r.URL.Query().Get("flash")}
	if !p.Auth && p.AllowActions {
		p.Actor = strings.TrimSpace(c.cfg.Actor(r))
	}
	if p.AllowActions {
		tok, err := c.csrf.token(w, r, r.TLS != nil || c.auth.forwardedHTTPS(r))
		if err != nil {
			http.Error(w, "generate CSRF token: "+err.Error(), http.StatusInternalServerError)
			return
		}
		p.CSRF = tok
	}
	var buf bytes.Buffer
	if err := c.pages[name].Execute(&buf, p); err != nil {
		c.log.Error("render page", "page", name, "err", err)
		http.Error(w, "render page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail renders an error page with status.
func (c *console) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	if status >= 500 {
		c.log.Error("console request failed", "path", r.URL.Path, "err", err)
	}
	c.render(w, r, status, "error", http.StatusText(status), struct {
		Status int
		Error  string
	}{status, err.Error()})
}

// sagaFilter is the list's filter form.
type sagaFilter struct {
	Type, Status, Version, Key string
	Overdue                    bool
}

func (f sagaFilter) query() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"type": f.Type, "status": f.Status, "version": f.Version, "key": f.Key} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if f.Overdue {
		v.Set("overdue", "1")
	}
	return v
}

// sagaRow is one saga of the list.
type sagaRow struct {
	*orchestrator.Saga
	Step    string
	Overdue bool
}

func rowOf(s *orchestrator.Saga, now time.Time) sagaRow {
	r := sagaRow{Saga: s}
	if s.CurrentStep >= 0 && s.CurrentStep < len(s.Steps) && !s.Status.Terminal() {
		r.Step = s.Steps[s.CurrentStep].Name
	}
	r.Overdue = !s.Deadline.IsZero() && s.Deadline.Before(now) && (s.Status == saga.StatusRunning || s.Status == saga.StatusCompensating)
	return r
}

var statuses = []saga.Status{saga.StatusQueued, saga.StatusRunning, saga.StatusCompensating, saga.StatusCompleted, saga.StatusCompensated, saga.StatusFailed, saga.StatusTerminated}

func (c *console) sagaList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := sagaFilter{Type: strings.TrimSpace(q.Get("type")), Status: q.Get("status"), Version: strings.TrimSpace(q.Get("version")),
		Key: q.Get("key"), Overdue: q.Get("overdue") != ""}
	opts := &orchestrator.ListOpts{Type: f.Type, StartKey: f.Key, Overdue: f.Overdue, Limit: c.cfg.PageSize, After: q.Get("after")}
	if f.Status != "" {
		st := saga.Status(f.Status)
		if !st.Valid() {
			c.fail(w, r, http.StatusBadRequest, fmt.Errorf("status %q: want one of %v", f.Status, statuses))
			return
		}
		opts.Statuses = []saga.Status{st}
	}
	if f.Version != "" {
		v, err := strconv.Atoi(f.Version)
		if err != nil || v < 1 {
			c.fail(w, r, http.StatusBadRequest, fmt.Errorf("version %q: want a number from 1", f.Version))
			return
		}
		opts.Version = v
	}
	res, err := c.orch.List(r.Context(), opts)
	if err != nil {
		c.fail(w, r, statusOf(err), err)
		return
	}
	now := time.Now()
	rows := make([]sagaRow, len(res.Sagas))
	for i, s := range res.Sagas {
		rows[i] = rowOf(s, now)
	}
	next := ""
	if res.Cursor != "" {
		v := f.query()
		v.Set("after", res.Cursor)
		next = c.cfg.BasePath + "/sagas?" + v.Encode()
	}
	first := ""
	if opts.After != "" {
		first = c.cfg.BasePath + "/sagas?" + f.query().Encode()
	}
	c.render(w, r, http.StatusOK, "sagas", "Sagas", struct {
		Filter   sagaFilter
		Statuses []saga.Status
		Sagas    []sagaRow
		Next     string
		First    string
		Held     []store.SagaCount
	}{f, statuses, rows, next, first, c.heldSagas(r.Context())})
}

// statusOf maps a read error to an HTTP status.
func statusOf(err error) int {
	switch {
	case errors.Is(err, orchestrator.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, context.Canceled):
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// barrierRow is one barrier mark, with the schema it is in.
type barrierRow struct {
	Schema string
	store.BarrierRecord
}

// historyRow is one history entry, with whether an operator made it.
type historyRow struct {
	saga.HistoryEntry
	Seq      int
	Operator bool
}

func (c *console) sagaShow(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, fmt.Errorf("%q is not a saga id (a UUID)", r.PathValue("id")))
		return
	}
	ctx := r.Context()
	s, err := c.orch.Get(ctx, id)
	if err != nil {
		c.fail(w, r, statusOf(err), err)
		return
	}
	hist, err := c.orch.History(ctx, id)
	if err != nil {
		c.fail(w, r, statusOf(err), err)
		return
	}
	rows := make([]historyRow, len(hist))
	for i, h := range hist {
		rows[i] = historyRow{HistoryEntry: h, Seq: i + 1, Operator: h.Actor != ""}
	}
	var marks []barrierRow
	var markErrs []string
	for _, sc := range c.schemas {
		recs, err := sc.store.BarrierMarks(ctx, id)
		if err != nil {
			markErrs = append(markErrs, err.Error())
			continue
		}
		for _, m := range recs {
			marks = append(marks, barrierRow{Schema: sc.name, BarrierRecord: m})
		}
	}
	pending, err := c.pendingFor(ctx, id)
	if err != nil {
		c.fail(w, r, statusOf(err), err)
		return
	}
	var op *orchestrator.Request
	if n, err := strconv.ParseInt(r.URL.Query().Get("op"), 10, 64); err == nil {
		if o, err := c.orch.GetRequest(ctx, n); err == nil && o.SagaID == id {
			op = o
		}
	}
	data, _ := json.MarshalIndent(json.RawMessage(s.Data), "", "  ")
	c.render(w, r, http.StatusOK, "saga", "Saga "+s.ID.String(), struct {
		Saga         sagaRow
		TraceID      string
		Data         string
		History      []historyRow
		Barrier      []barrierRow
		BarrierEr    []string
		Pending      []orchestrator.Request
		Op           *orchestrator.Request
		CanRetry     bool
		CanAbort     bool
		CanTerminate bool
		CanRestart   bool
		Pictures     pictures
	}{
		Saga: rowOf(s, time.Now()), TraceID: traceID(s.TraceParent), Data: string(data), History: rows,
		Barrier: marks, BarrierEr: markErrs, Pending: pending, Op: op,
		CanRetry:     s.Status == saga.StatusRunning || s.Status == saga.StatusCompensating || s.Status == saga.StatusFailed,
		CanAbort:     s.Status == saga.StatusRunning || s.Status == saga.StatusQueued,
		CanTerminate: canTerminate(s.Status),
		CanRestart:   canRestart(s.Status),
		Pictures:     c.picturesOf(ctx, s, hist),
	})
}

// pendingFor returns the pending operator requests of saga id (among the
// oldest pages of pending requests, which an orchestrator keeps short).
func (c *console) pendingFor(ctx context.Context, id uuid.UUID) ([]orchestrator.Request, error) {
	ops, err := c.orch.ListRequests(ctx, &orchestrator.ListRequestsOpts{Limit: 1000})
	if err != nil {
		return nil, err
	}
	var out []orchestrator.Request
	for _, op := range ops {
		if op.SagaID == id {
			out = append(out, op)
		}
	}
	return out, nil
}

// traceID is the trace id of a W3C traceparent ("00-<trace>-<span>-<flags>").
func traceID(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || len(parts[1]) != 32 {
		return ""
	}
	return parts[1]
}

// waitingTypes is how many types of unpublished commands the outbox page
// lists per schema.
const waitingTypes = 20

// heldSagas returns, by saga type, the sagas of the orchestrator's schema
// that have waited past their deadline for an unpublished command or
// compensation (store.Store.UnpublishedOverdue): the notice on the sagas
// and outbox pages. Nil on an error: the notice is a hint, the pages show
// without it.
func (c *console) heldSagas(ctx context.Context) []store.SagaCount {
	for _, sc := range c.schemas {
		if sc.name != c.cfg.Schema {
			continue
		}
		counts, err := sc.store.UnpublishedOverdue(ctx, orchestrator.OverdueGrace)
		if err != nil {
			c.log.Warn("console: count the sagas waiting for unpublished messages", "schema", sc.name, "err", err)
			return nil
		}
		return counts
	}
	return nil
}

// schemaOutbox is the outbox page's section of one schema.
type schemaOutbox struct {
	Schema string
	Error  string
	Stats  store.OutboxStats
	// Waiting is the commands and compensations waiting to be published,
	// by type.
	Waiting []store.OutboxTypeBacklog
	Dead    []store.DeadRow
	Inbox   []store.Attempt
	// DeadNext and InboxNext link to the next page of Dead and of Inbox
	// when this one is full.
	DeadNext, InboxNext string
}

// outboxPage is what the outbox page's query asks for: one schema's
// section (Schema) paged past a dead row (DeadAfter) or a dead-lettered
// delivery (InboxAfter), or every schema's first pages.
type outboxPage struct {
	Schema     string
	DeadAfter  *store.DeadRow
	InboxAfter *store.Attempt
}

// Paged reports whether the page is past the first of a list.
func (p outboxPage) Paged() bool { return p.DeadAfter != nil || p.InboxAfter != nil }

func (c *console) outbox(w http.ResponseWriter, r *http.Request) {
	page, err := c.outboxQuery(r.URL.Query())
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	ctx := r.Context()
	out := make([]schemaOutbox, 0, len(c.schemas))
	for _, sc := range c.schemas {
		if page.Schema != "" && sc.name != page.Schema {
			continue
		}
		so := schemaOutbox{Schema: sc.name}
		var err error
		if so.Stats, err = sc.store.OutboxStats(ctx); err == nil {
			if so.Waiting, err = sc.store.OutboxUnpublishedByType(ctx, waitingTypes); err == nil {
				if so.Dead, err = sc.store.DeadRows(ctx, page.DeadAfter, c.cfg.PageSize); err == nil {
					so.Inbox, err = sc.store.Attempts(ctx, true, page.InboxAfter, c.cfg.PageSize)
				}
			}
		}
		if err != nil {
			so.Error = err.Error()
		}
		if n := len(so.Dead); n == c.cfg.PageSize {
			so.DeadNext = c.outboxURL(sc.name, "dead_after", pageCursor(so.Dead[n-1].DeadAt, strconv.FormatInt(so.Dead[n-1].ID, 10)))
		}
		if n := len(so.Inbox); n == c.cfg.PageSize {
			so.InboxNext = c.outboxURL(sc.name, "inbox_after", pageCursor(so.Inbox[n-1].UpdatedAt, so.Inbox[n-1].MessageID.String()))
		}
		out = append(out, so)
	}
	c.render(w, r, http.StatusOK, "outbox", "Outbox and dead letters", struct {
		Schemas  []schemaOutbox
		PageSize int
		Page     outboxPage
		Held     []store.SagaCount
	}{out, c.cfg.PageSize, page, c.heldSagas(ctx)})
}

// outboxQuery reads the outbox page's query: schema, and dead_after and
// inbox_after, each a cursor of that schema's list (the page's links set
// one of them).
func (c *console) outboxQuery(q url.Values) (outboxPage, error) {
	page := outboxPage{Schema: q.Get("schema")}
	if page.Schema != "" && !slices.ContainsFunc(c.schemas, func(sc schemaStore) bool { return sc.name == page.Schema }) {
		return page, fmt.Errorf("schema %q: the console shows none by that name", page.Schema)
	}
	dead, inbox := q.Get("dead_after"), q.Get("inbox_after")
	if (dead != "" || inbox != "") && page.Schema == "" {
		return page, errors.New("dead_after and inbox_after page one schema's list: give schema too")
	}
	if dead != "" {
		at, key, err := parsePageCursor(dead)
		id, perr := strconv.ParseInt(key, 10, 64)
		if err != nil || perr != nil {
			return page, fmt.Errorf("dead_after %q: want the cursor of a next-page link", dead)
		}
		page.DeadAfter = &store.DeadRow{ID: id, DeadAt: at}
	}
	if inbox != "" {
		at, key, err := parsePageCursor(inbox)
		id, perr := uuid.Parse(key)
		if err != nil || perr != nil {
			return page, fmt.Errorf("inbox_after %q: want the cursor of a next-page link", inbox)
		}
		page.InboxAfter = &store.Attempt{MessageID: id, UpdatedAt: at}
	}
	return page, nil
}

// outboxURL is the outbox page of schema with query key set to value.
func (c *console) outboxURL(schema, key, value string) string {
	return c.cfg.BasePath + "/outbox?" + url.Values{"schema": {schema}, key: {value}}.Encode()
}

// pageCursor is the position of a list entry ordered by time, then key:
// "<unix microseconds>_<key>". PostgreSQL keeps microseconds, so the time
// goes back to the database exactly.
func pageCursor(at time.Time, key string) string {
	return strconv.FormatInt(at.UnixMicro(), 10) + "_" + key
}

// parsePageCursor reads a pageCursor.
func parsePageCursor(s string) (time.Time, string, error) {
	micros, key, ok := strings.Cut(s, "_")
	n, err := strconv.ParseInt(micros, 10, 64)
	if !ok || err != nil || key == "" {
		return time.Time{}, "", fmt.Errorf("page cursor %q: want <unix microseconds>_<key>", s)
	}
	return time.UnixMicro(n), key, nil
}

func (c *console) requests(w http.ResponseWriter, r *http.Request) {
	var after int64
	if s := r.URL.Query().Get("after"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			c.fail(w, r, http.StatusBadRequest, fmt.Errorf("after %q: want a request id", s))
			return
		}
		after = n
	}
	ops, err := c.orch.ListRequests(r.Context(), &orchestrator.ListRequestsOpts{After: after, Limit: c.cfg.PageSize})
	if err != nil {
		c.fail(w, r, statusOf(err), err)
		return
	}
	next := ""
	if len(ops) == c.cfg.PageSize {
		next = fmt.Sprintf("%s/requests?after=%d", c.cfg.BasePath, ops[len(ops)-1].ID)
	}
	c.render(w, r, http.StatusOK, "requests", "Pending operator requests", struct {
		Requests []orchestrator.Request
		Next     string
		Paged    bool
	}{ops, next, after != 0})
}
