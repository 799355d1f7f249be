// Command sagabox operates sagabox: it applies migrations, inspects sagas,
// outboxes and inboxes, runs operator actions (retry, abort) and lists and
// cancels their requests, inspects and replays RabbitMQ dead letters, tears
// down a namespace and measures the relay. Every command with output prints
// JSON with --json (docs/operations.md). Run `sagabox help` for the commands.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
