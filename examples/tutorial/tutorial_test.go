package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/internal/testkit/amqptest"
	"github.com/sagabox/sagabox/internal/testkit/dbtest"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/transport"
	"github.com/sagabox/sagabox/transport/rabbitmq"
)

// tutorialPath is docs/tutorial.md, from this package's directory.
const tutorialPath = "../../docs/tutorial.md"

// fence is a fenced code block of the tutorial.
type fence struct {
	lang string // the info string: go, sh or text
	file string // a go block's file: the one its caption names
	text string // the lines between the fences, each ending in "\n"
	line int    // the line of the opening fence
}

// caption is the end of the prose line before every go block: the file of
// the program the block is a piece of.
var caption = regexp.MustCompile("`([a-z]+\\.go)`:$")

// readTutorial returns the fenced blocks of the tutorial, in order.
func readTutorial(t *testing.T) []fence {
	t.Helper()
	b, err := os.ReadFile(tutorialPath)
	require.NoError(t, err)
	var (
		blocks []fence
		cur    *fence
		prose  string // the last non-blank line outside a block
	)
	for i, line := range strings.Split(string(b), "\n") {
		switch {
		case cur != nil && line == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		case strings.HasPrefix(line, "```"):
			cur = &fence{lang: strings.TrimPrefix(line, "```"), line: i + 1}
			if cur.lang == "go" {
				m := caption.FindStringSubmatch(prose)
				require.NotNil(t, m, "docs/tutorial.md:%d: the line before a go block must end with `FILE.go`: naming the file it comes from", i+1)
				cur.file = m[1]
			}
		case strings.TrimSpace(line) != "":
			prose = line
		}
	}
	require.Nil(t, cur, "docs/tutorial.md: a code block is not closed")
	return blocks
}

// The tutorial's Go blocks are the program: each appears verbatim in the
// file its caption names, and the blocks of a file, joined by blank
// lines, are the whole file, so that a reader who copies them has the
// program this package compiles (and TestTutorialEndToEnd runs).
func TestTutorialGoBlocksAreTheProgram(t *testing.T) {
	t.Parallel()
	byFile := map[string][]fence{}
	for _, b := range readTutorial(t) {
		if b.lang == "go" {
			byFile[b.file] = append(byFile[b.file], b)
		}
	}
	sources, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, f := range sources {
		if !strings.HasSuffix(f, "_test.go") {
			require.Contains(t, byFile, f, "docs/tutorial.md shows no block of %s", f)
		}
	}
	for file, blocks := range byFile {
		src, err := os.ReadFile(file)
		require.NoError(t, err, "docs/tutorial.md:%d names %s", blocks[0].line, file)
		texts := make([]string, len(blocks))
		for i, b := range blocks {
			require.True(t, strings.Contains(string(src), b.text), "docs/tutorial.md:%d: the block is not in %s as it stands", b.line, file)
			texts[i] = b.text
		}
		require.Equal(t, string(src), strings.Join(texts, "\n"),
			"docs/tutorial.md: the blocks of %s, in order and joined by blank lines, must be the whole file", file)
	}
}

// The tutorial end to end, on fresh schemas and a fresh RabbitMQ
// namespace: the program prints what the tutorial shows, twice (the start
// keys make the second run start nothing); the sagas and the airline's
// tables end as the text says; and every sagabox command the tutorial
// shows runs against the program's schemas and prints what the tutorial
// shows, ids, times and durations aside.
func TestTutorialEndToEnd(t *testing.T) {
	t.Parallel()
	blocks := readTutorial(t)
	pool := dbtest.Pool(t)
	prefix := dbtest.SchemaName(t)
	cfg := Config{
		DatabaseURL:   dbtest.URL(),
		AMQPURL:       amqptest.URL(t),
		TripsSchema:   prefix + "_trips",
		AirlineSchema: prefix + "_airline",
		Namespace:     amqptest.Namespace(t),
		Logger:        amqptest.Logger(t),
	}
	dbtest.DropSchemaOnCleanup(t, pool, cfg.TripsSchema)
	dbtest.DropSchemaOnCleanup(t, pool, cfg.AirlineSchema)
	t.Cleanup(func() { removeQueues(t, cfg) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The program, as `go run .` runs it.
	want := outputOf(t, blocks, "go run .")
	for range 2 {
		var out bytes.Buffer
		require.NoError(t, run(ctx, cfg, &out))
		require.Equal(t, want, out.String())
	}

	// Both sagas, and Bob's history as `saga show` prints it.
	orch, err := orchestrator.NewClient(orchestrator.Config{Pool: pool, Schema: cfg.TripsSchema, Service: "tutorial-test"})
	require.NoError(t, err)
	ada, err := orch.GetByKey(ctx, BookTrip.Name(), "trip-ada")
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompleted, ada.Status)
	bob, err := orch.GetByKey(ctx, BookTrip.Name(), "trip-bob")
	require.NoError(t, err)
	require.Equal(t, saga.StatusCompensated, bob.Status)
	require.Equal(t, "card declined", bob.LastError)
	hist, err := orch.History(ctx, bob.ID)
	require.NoError(t, err)
	var events []string
	for _, h := range hist {
		events = append(events, h.Step+" "+string(h.Event))
	}
	require.Equal(t, []string{
		" started", "reserve-seat command-sent", "reserve-seat reply-applied", "charge-card command-sent",
		"charge-card step-rejected", "reserve-seat compensation-sent", "reserve-seat step-compensated", " compensated",
	}, events)

	// The airline holds both seats, Bob's released, and Ada's charge only.
	require.Equal(t, []string{"trip-ada 1A false", "trip-bob 2A true"}, column(ctx, t, pool,
		`SELECT trip_id || ' ' || seat || ' ' || released FROM `+pgx.Identifier{cfg.AirlineSchema, "seat"}.Sanitize()+` ORDER BY trip_id`))
	require.Equal(t, []string{"trip-ada"}, column(ctx, t, pool,
		`SELECT trip_id FROM `+pgx.Identifier{cfg.AirlineSchema, "charge"}.Sanitize()))

	// Every command of the tutorial's shell blocks.
	cli := buildCLI(t)
	ran := 0
	for i, b := range blocks {
		if b.lang != "sh" {
			continue
		}
		lines := strings.Split(strings.TrimSpace(b.text), "\n")
		for _, line := range lines {
			if !strings.HasPrefix(line, "sagabox ") {
				require.True(t, slices.ContainsFunc(notRun, func(p string) bool { return strings.HasPrefix(line, p) }),
					"docs/tutorial.md:%d: %q is neither a sagabox command this test runs nor one it knows not to run", b.line, line)
				continue
			}
			args := cliArgs(line, cfg)
			ran++
			if args[0] == "ui" {
				checkConsole(t, cli, args, bob.ID.String())
				continue
			}
			stdout, stderr, err := runCLI(cli, args)
			require.NoError(t, err, "docs/tutorial.md:%d: %s: %s", b.line, line, stderr)
			if len(lines) == 1 && i+1 < len(blocks) && blocks[i+1].lang == "text" {
				require.Equal(t, normalize(blocks[i+1].text), normalize(stdout), "docs/tutorial.md:%d: the output of %s", blocks[i+1].line, line)
			}
		}
	}
	require.Positive(t, ran, "the tutorial shows sagabox commands")
}

// notRun are the tutorial's shell commands the test does not run: setting
// up a module, running the program (run is called instead), dropping the
// schemas (the test drops its own).
var notRun = []string{"mkdir ", "go mod init ", "go get ", "go install ", "go run .", "psql "}

// outputOf returns the text block that follows the shell block whose one
// command is cmd.
func outputOf(t *testing.T, blocks []fence, cmd string) string {
	t.Helper()
	for i, b := range blocks {
		if b.lang == "sh" && strings.TrimSpace(b.text) == cmd && i+1 < len(blocks) && blocks[i+1].lang == "text" {
			return blocks[i+1].text
		}
	}
	require.FailNow(t, "docs/tutorial.md shows no output of "+cmd)
	return ""
}

// cliArgs returns the arguments of a sagabox command line of the tutorial
// for the test's database, schemas and namespace.
func cliArgs(line string, cfg Config) []string {
	names := map[string]string{"trips": cfg.TripsSchema, "airline": cfg.AirlineSchema, "tutorial": cfg.Namespace}
	args := strings.Fields(line)[1:]
	namespaced := false
	for i := 1; i < len(args); i++ {
		switch args[i-1] {
		case "--schema", "--messaging-schema", "--namespace":
			if name, ok := names[args[i]]; ok {
				args[i] = name
			}
			namespaced = namespaced || args[i-1] == "--namespace"
		}
	}
	args = append(args, "--database-url", cfg.DatabaseURL)
	if namespaced {
		args = append(args, "--amqp-url", cfg.AMQPURL)
	}
	return args
}

var (
	uuidPattern     = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	timePattern     = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	durationPattern = regexp.MustCompile(`(^|\s)[+-]?(\d+(\.\d+)?(ns|µs|ms|s|m|h))+(\s|$)`)
	spaces          = regexp.MustCompile(`[ \t]+`)
)

// normalize replaces what differs from run to run in a command's output
// (ids, times, durations) and the column padding that follows from them.
func normalize(s string) string {
	s = uuidPattern.ReplaceAllString(s, "<id>")
	s = timePattern.ReplaceAllString(s, "<time>")
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		// Twice: a match takes the white space on both sides of a duration,
		// so two durations in a row need a second pass.
		l = durationPattern.ReplaceAllString(l, "$1<duration>$5")
		l = durationPattern.ReplaceAllString(l, "$1<duration>$5")
		lines[i] = strings.TrimRight(spaces.ReplaceAllString(l, " "), " ")
	}
	return strings.Join(lines, "\n")
}

// buildCLI builds the sagabox command into a directory of the test's.
func buildCLI(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sagabox")
	out, err := exec.Command("go", "build", "-o", path, "github.com/sagabox/sagabox/cmd/sagabox").CombinedOutput()
	require.NoError(t, err, "go build sagabox: %s", out)
	return path
}

// runCLI runs the sagabox command at path with args.
func runCLI(path string, args []string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// consoleURL is the address `sagabox ui` prints when it serves.
var consoleURL = regexp.MustCompile(`on (http://\S+/) `)

// checkConsole runs `sagabox ui` with args on a free port, reads the saga
// list and Bob's saga page, then stops it as Ctrl-C does.
func checkConsole(t *testing.T, path string, args []string, bobID string) {
	t.Helper()
	out := &firstLine{done: make(chan struct{})}
	var errOut bytes.Buffer
	cmd := exec.Command(path, append(args, "--addr", "127.0.0.1:0")...)
	cmd.Stdout, cmd.Stderr = out, &errOut
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case <-out.done:
	case err := <-exited:
		require.FailNow(t, "sagabox ui exited", "%v: %s", err, errOut.String())
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		require.FailNow(t, "sagabox ui printed no address within 30s", "%v: %s", <-exited, errOut.String())
	}
	defer func() {
		require.NoError(t, cmd.Process.Signal(os.Interrupt))
		require.NoError(t, <-exited, "sagabox ui stops on Ctrl-C: %s", errOut.String())
	}()
	m := consoleURL.FindStringSubmatch(out.line())
	require.NotNil(t, m, "sagabox ui's first line names its address: %q", out.line())
	for page, want := range map[string][]string{
		"sagas":          {"trip-ada", "trip-bob", "completed", "compensated"},
		"sagas/" + bobID: {"Barrier decisions", "reserve-seat", "charge-card", "rejected", "card declined"},
	} {
		body := get(t, m[1]+page)
		for _, w := range want {
			require.Contains(t, body, w, "the console's /%s", page)
		}
	}
}

// get returns the body of a GET of url, which must answer 200.
func get(t *testing.T, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s: %s", url, body)
	return string(body)
}

// firstLine is a writer that closes done once its first line is complete.
type firstLine struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	done chan struct{}
	seen bool
}

func (w *firstLine) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.seen && bytes.Contains(w.buf.Bytes(), []byte("\n")) {
		w.seen = true
		close(w.done)
	}
	return len(p), nil
}

func (w *firstLine) line() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	first, _, _ := strings.Cut(w.buf.String(), "\n")
	return first
}

// removeQueues deletes the program's queues and exchanges in the test's
// namespace: it declares them through a broker of its own, whose topology
// amqptest deletes.
func removeQueues(t *testing.T, cfg Config) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: cfg.AMQPURL, Namespace: cfg.Namespace, Logger: cfg.Logger})
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	for _, svc := range []string{"trips", "airline"} {
		if err := b.Declare(ctx, transport.QueueSpec{Name: svc}); err != nil {
			t.Errorf("cleanup: declare %s: %v", svc, err)
		}
	}
	_ = b.Close()
	amqptest.DeleteTopology(t, b)
}

// column returns the text column of the rows query returns.
func column(ctx context.Context, t *testing.T, pool *pgxpool.Pool, query string) []string {
	t.Helper()
	rows, err := pool.Query(ctx, query)
	require.NoError(t, err)
	values, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return values
}
