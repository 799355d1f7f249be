package relay

import (
	"os"
	"testing"

	"github.com/sagabox/sagabox/internal/testkit"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelperRelay())
	}
	testkit.WrapTestMain(m, closeLogPostgres)
}
