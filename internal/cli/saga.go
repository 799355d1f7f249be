package cli

import "github.com/spf13/cobra"

func (a *app) sagaCommand() *cobra.Command {
	return &cobra.Command{Use: "saga", Short: "List, show, retry and abort sagas"}
}
