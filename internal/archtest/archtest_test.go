// Package archtest holds the import rules of sagabox's layout (STYLE.md) as
// a test, so that they cannot erode unnoticed.
package archtest

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/sagabox/sagabox"

type pkg struct {
	ImportPath string
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
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else {
			require.NoError(t, err)
		}
		pkgs = append(pkgs, p)
	}
	require.NotEmpty(t, pkgs)
	return pkgs
}

func hasPrefix(path string, prefixes ...string) bool {
	for _, p := range prefixes {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

// TestImportRules checks the import direction that STYLE.md sets: saga is
// pure; only store sees pgx's lower layers and the sqlc output; only the
// RabbitMQ adapter imports amqp091-go.
func TestImportRules(t *testing.T) {
	t.Parallel()
	for _, p := range listPackages(t) {
		for _, imp := range p.Imports {
			switch {
			case hasPrefix(p.ImportPath, module+"/saga") && strings.HasPrefix(imp, module) && !hasPrefix(imp, module+"/saga"):
				t.Errorf("%s imports %s: saga must import nothing of ours", p.ImportPath, imp)
			case hasPrefix(p.ImportPath, module+"/saga") && (strings.HasPrefix(imp, "github.com/jackc/") || strings.HasPrefix(imp, "github.com/rabbitmq/")):
				t.Errorf("%s imports %s: saga must do no I/O", p.ImportPath, imp)
			case hasPrefix(imp, "github.com/jackc/pgx/v5/pgconn", "github.com/jackc/pgx/v5/pgtype") && !hasPrefix(p.ImportPath, module+"/store", module+"/internal/dbtest"):
				t.Errorf("%s imports %s: only store sees pgconn/pgtype", p.ImportPath, imp)
			case hasPrefix(imp, module+"/store/internal/dbsqlc") && !hasPrefix(p.ImportPath, module+"/store"):
				t.Errorf("%s imports %s: sqlc output is private to store", p.ImportPath, imp)
			case hasPrefix(imp, "github.com/rabbitmq/amqp091-go") && !hasPrefix(p.ImportPath, module+"/transport/rabbitmq", module+"/internal/amqptest"):
				t.Errorf("%s imports %s: only transport/rabbitmq talks AMQP", p.ImportPath, imp)
			case hasPrefix(p.ImportPath, module+"/transport") && !hasPrefix(p.ImportPath, module+"/transport/rabbitmq", module+"/transport/transporttest") &&
				strings.HasPrefix(imp, module) && !hasPrefix(imp, module+"/transport"):
				t.Errorf("%s imports %s: transport depends on nothing else of ours", p.ImportPath, imp)
			}
		}
	}
}
