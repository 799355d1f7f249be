package cli_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/cli"
	"github.com/sagabox/sagabox/internal/testkit"
)

// asSagaboxEnv, when set, makes this test binary the sagabox command: the
// processes the command starts from its own executable (the orchestrator
// replicas of `bench sagas --replicas`) are then the command too.
const asSagaboxEnv = "SAGABOX_CLI_TEST_AS_SAGABOX"

func TestMain(m *testing.M) {
	if os.Getenv(asSagaboxEnv) != "" {
		// Re-executed by the command under test: run as cmd/sagabox's main.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	if err := os.Setenv(asSagaboxEnv, "1"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	testkit.WrapTestMain(m)
}
