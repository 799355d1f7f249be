package orchestrator_test

import (
	"os"
	"testing"

	"github.com/sagabox/sagabox/internal/testkit"
)

func TestMain(m *testing.M) {
	if os.Getenv(childSchemaEnv) != "" {
		// Re-executed by TestGuaranteeCrashedOrchestratorRecovers: run only
		// an orchestrator until killed.
		os.Exit(runChildOrchestrator())
	}
	if os.Getenv(starterSchemaEnv) != "" {
		// Re-executed by TestNotifyWakesTheRelayOfAnotherProcess: start one
		// saga and exit.
		os.Exit(runChildStarter())
	}
	testkit.WrapTestMain(m)
}
