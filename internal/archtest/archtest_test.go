// Package archtest holds the import rules of sagabox's layout (README.md,
// "Layout") as a test, so that they cannot erode unnoticed. The linter's depguard rules
// (.golangci.yml) say the same for each file; this test checks the built
// packages, tests included where a rule covers them.
package archtest

import (
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/sagabox/sagabox"

type pkg struct {
	ImportPath string
	Name       string
	Dir        string
	GoFiles    []string
	Imports    []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-json", module+"/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	require.NoError(t, err, "go list")
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var pkgs []pkg
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		pkgs = append(pkgs, p)
	}
	require.NotEmpty(t, pkgs)
	return pkgs
}

// under reports whether path is one of prefixes or inside one.
func under(path string, prefixes ...string) bool {
	for _, p := range prefixes {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

func ours(path string) bool { return under(path, module) }

// rule is one import rule: no package matching from may import a package
// matching to.
type rule struct {
	why      string
	from, to func(string) bool
}

func in(prefixes ...string) func(string) bool {
	full := make([]string, len(prefixes))
	for i, p := range prefixes {
		full[i] = module + "/" + p
	}
	return func(path string) bool { return under(path, full...) }
}

func external(prefixes ...string) func(string) bool {
	return func(path string) bool { return under(path, prefixes...) }
}

func not(f func(string) bool) func(string) bool { return func(p string) bool { return !f(p) } }

func and(fs ...func(string) bool) func(string) bool {
	return func(p string) bool {
		for _, f := range fs {
			if !f(p) {
				return false
			}
		}
		return true
	}
}

var rules = []rule{
	{"saga imports nothing of ours", in("saga"), and(ours, not(in("saga")))},
	{"saga does no I/O", in("saga"), external("github.com/jackc", "github.com/rabbitmq")},
	{"message imports nothing of ours", in("message"), and(ours, not(in("message")))},
	{"store speaks message's types, not transport's", in("store"), in("transport")},
	{"store makes no tracing decisions", in("store"), external("go.opentelemetry.io")},
	{"store is below the engine and the clients", in("store"), in("internal", "orchestrator", "participant", "cmd")},
	{"the driver contract imports nothing of ours but message", in("store/driver"), and(ours, not(in("message", "store/driver")))},
	{"transport knows nothing of persistence", in("transport"), in("store")},
	{"transport is below the engine and the clients", in("transport"), in("internal", "orchestrator", "participant", "cmd")},
	{"the orchestrator never imports the participant", in("orchestrator"), in("participant")},
	{"the participant never imports the orchestrator", in("participant"), in("orchestrator")},
	{"internal/ is below the clients", in("internal"), in("orchestrator", "participant", "cmd")},
	{"only store sees pgconn and pgtype", not(in("store", "internal/testkit/dbtest")), external("github.com/jackc/pgx/v5/pgconn", "github.com/jackc/pgx/v5/pgtype")},
	{"sqlc output is private to store", not(in("store")), in("store/internal/dbsqlc")},
	// The saga bench's hand-written baseline (what the engine is measured
	// against) talks AMQP directly, by design; nothing else in the bench does
	// beyond reading the server version and deleting its queues.
	{"only transport/rabbitmq talks AMQP", not(in("transport/rabbitmq", "internal/testkit/amqptest", "cmd/sagabox/internal/bench")), external("github.com/rabbitmq/amqp091-go")},
	{"the console is a tool above the clients", in("saga", "message", "store", "transport", "internal", "orchestrator", "participant"), in("console")},
	// faulttest is test support for users' services, like saga/sagatest:
	// the library never depends on it, and it drives sagabox through the
	// public API only, as a user's test does.
	{"the library never imports the fault kit", in("saga", "message", "store", "transport", "internal", "orchestrator", "participant", "cmd"), in("faulttest")},
	{"the fault kit uses the public API only", in("faulttest"), in("internal")},
	{"the library uses the OpenTelemetry API only", not(in("examples", "internal/testkit")), external("go.opentelemetry.io/otel/sdk", "go.opentelemetry.io/otel/exporters")},
	// The one door to PostgreSQL: the engine speaks the driver contract,
	// never its implementation.
	{"the engine sees PostgreSQL only through the driver contract", in("internal/engine", "internal/relay", "internal/telemetry"), and(in("store"), not(in("store/driver")))},
	// Tools work through the clients' and the store's public operations,
	// as a user's tool would.
	{"tools use public operations, never the driver or the engine", in("console", "faulttest", "cmd", "examples"), in("store/driver", "internal/engine", "internal/relay", "internal/telemetry")},
}

// executorUsers are the packages whose code may open the driver's executor
// (store.NewExecutor): the two clients build their engine on it, and the
// test kit's database helper hands it to the engine's own tests.
var executorUsers = []string{"store", "orchestrator", "participant", "internal/testkit/dbtest"}

// TestImportRules checks the import direction that README.md sets: every
// arrow points down (cmd → clients → internal engine → store, transport →
// message; saga is a leaf), the two clients never import each other, and
// only store, transport/rabbitmq and the test kit see pgx's lower layers and
// AMQP.
func TestImportRules(t *testing.T) {
	t.Parallel()
	for _, p := range listPackages(t) {
		for _, imp := range p.Imports {
			for _, r := range rules {
				if r.from(p.ImportPath) && r.to(imp) {
					t.Errorf("%s imports %s: %s", p.ImportPath, imp, r.why)
				}
			}
		}
	}
}

// TestRulesCatchViolations makes sure the rules are not vacuous: each names
// an import that it refuses.
func TestRulesCatchViolations(t *testing.T) {
	t.Parallel()
	violations := map[string][2]string{
		"saga imports nothing of ours":                                {module + "/saga", module + "/message"},
		"message imports nothing of ours":                             {module + "/message", module + "/transport"},
		"store speaks message's types, not transport's":               {module + "/store", module + "/transport"},
		"store makes no tracing decisions":                            {module + "/store", "go.opentelemetry.io/otel/propagation"},
		"transport knows nothing of persistence":                      {module + "/transport/rabbitmq", module + "/store"},
		"the orchestrator never imports the participant":              {module + "/orchestrator", module + "/participant"},
		"the participant never imports the orchestrator":              {module + "/participant", module + "/orchestrator"},
		"internal/ is below the clients":                              {module + "/internal/relay", module + "/orchestrator"},
		"store is below the engine and the clients":                   {module + "/store", module + "/internal/engine"},
		"the driver contract imports nothing of ours but message":     {module + "/store/driver", module + "/store"},
		"the console is a tool above the clients":                     {module + "/orchestrator", module + "/console"},
		"the library never imports the fault kit":                     {module + "/participant", module + "/faulttest"},
		"the fault kit uses the public API only":                      {module + "/faulttest", module + "/internal/engine"},
		"the engine sees PostgreSQL only through the driver contract": {module + "/internal/engine", module + "/store"},
		"tools use public operations, never the driver or the engine": {module + "/cmd/sagabox/internal/bench", module + "/store/driver"},
	}
	for _, r := range rules {
		v, ok := violations[r.why]
		if !ok {
			continue
		}
		require.True(t, r.from(v[0]) && r.to(v[1]), "rule %q must refuse %s → %s", r.why, v[0], v[1])
		delete(violations, r.why)
	}
	require.Empty(t, violations, "every listed violation has its rule")
}

// TestOnlyTheClientsOpenTheExecutor checks that no package outside store,
// the two clients and the test kit's database helper calls
// store.NewExecutor: the driver's executor is the engine's door to
// PostgreSQL, and tools use public operations instead.
func TestOnlyTheClientsOpenTheExecutor(t *testing.T) {
	t.Parallel()
	allowed := in(executorUsers...)
	for _, p := range listPackages(t) {
		if allowed(p.ImportPath) {
			continue
		}
		for _, file := range p.GoFiles {
			for _, pos := range executorCalls(t, filepath.Join(p.Dir, file)) {
				t.Errorf("%s opens the driver's executor (store.NewExecutor) at %s: use the clients' or the store's operations", p.ImportPath, pos)
			}
		}
	}
}

// executorCalls returns the positions in the Go file path of references to
// store.NewExecutor (calls or method values).
func executorCalls(t *testing.T, path string) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	require.NoError(t, err)
	local := ""
	for _, imp := range f.Imports {
		if strings.Trim(imp.Path.Value, `"`) != module+"/store" {
			continue
		}
		local = "store"
		if imp.Name != nil {
			local = imp.Name.Name
		}
	}
	if local == "" {
		return nil
	}
	var found []string
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "NewExecutor" {
			return true
		}
		if id, ok := sel.X.(*ast.Ident); ok && id.Name == local {
			found = append(found, fset.Position(sel.Pos()).String())
		}
		return true
	})
	return found
}

// TestExecutorCallsAreFound makes sure executorCalls is not vacuous: it
// finds a call under the package's own name and under another.
func TestExecutorCallsAreFound(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, src := range map[string]string{
		"plain.go":   "package x\nimport \"" + module + "/store\"\nvar _, _ = store.NewExecutor(nil, \"s\")\n",
		"renamed.go": "package x\nimport st \"" + module + "/store\"\nvar f = st.NewExecutor\n",
	} {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(src), 0o600))
		require.Len(t, executorCalls(t, path), 1, name)
	}
}

// TestInternalHoldsNoProgram checks that internal/ holds libraries only:
// programs live under cmd/ (and examples/).
func TestInternalHoldsNoProgram(t *testing.T) {
	t.Parallel()
	for _, p := range listPackages(t) {
		if in("internal")(p.ImportPath) && p.Name == "main" {
			t.Errorf("%s is a program: programs live under cmd/", p.ImportPath)
		}
	}
}

// TestArchitecturePageIsTrue checks that docs/architecture.md, which lays
// out the packages and the rules of this test for people, stays true: it
// names every package of the module (its path, or a nested package's last
// element, in code quotes: a new package is placed on the page) and states
// every import rule, word for word.
func TestArchitecturePageIsTrue(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("../../docs/architecture.md")
	require.NoError(t, err)
	text := string(page)
	for _, p := range listPackages(t) {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if rel == "" || under(rel, "examples") {
			continue
		}
		last := rel[strings.LastIndex(rel, "/")+1:]
		if !strings.Contains(text, "`"+rel+"`") && !strings.Contains(text, "`"+last+"`") && !strings.Contains(text, "`"+rel+"/") {
			t.Errorf("docs/architecture.md does not place package %s: name it (`%s`) where it stands", rel, rel)
		}
	}
	for _, r := range rules {
		if !strings.Contains(text, "- "+r.why+"\n") {
			t.Errorf("docs/architecture.md does not state the rule %q (as a list item, word for word)", r.why)
		}
	}
}
