package cli

import (
	"fmt"
	"io"

	"github.com/sagabox/sagabox/store"
	"github.com/spf13/cobra"
)

// relayCommand groups the set-up of the relay's log mode.
func (a *app) relayCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "relay", Short: "Set up, inspect and remove the relay's log mode (logical replication slot and publication)"}
	var names store.OutboxLogNames
	resolved := func() (string, string) {
		s, p := store.DefaultOutboxLogNames(a.schema)
		if names.Slot != "" {
			s = names.Slot
		}
		if names.Publication != "" {
			p = names.Publication
		}
		return s, p
	}
	setup := &cobra.Command{
		Use:   "setup-log",
		Short: "Create the publication of the schema's outbox inserts and its logical replication slot (needs wal_level = logical)",
		Long: `Create the publication of the schema's outbox inserts and the logical
replication slot (pgoutput) that relays in log mode (Relay.Mode =
RelayModeLog) read. The slot keeps the write-ahead log from now on until a
relay confirms it: run this before switching a service to log mode, and
remove the slot with drop-log when no relay reads it any more (a forgotten
slot fills the disk). Run it once per schema, after migrate up.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, pool, err := a.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			s, p := resolved()
			created, err := st.SetupOutboxLog(cmd.Context(), names)
			if err != nil {
				return err
			}
			return a.print(map[string]any{"schema": a.schema, "slot": s, "publication": p, "created": created}, func(w io.Writer) {
				if created {
					fmt.Fprintf(w, "created publication %s and replication slot %s for schema %s\n", p, s, a.schema)
				} else {
					fmt.Fprintf(w, "replication slot %s exists already for schema %s (publication %s)\n", s, a.schema, p)
				}
			})
		},
	}
	drop := &cobra.Command{
		Use:   "drop-log",
		Short: "Drop the schema's replication slot and publication (refused while a relay reads the slot)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, pool, err := a.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			s, p := resolved()
			if err := st.DropOutboxLog(cmd.Context(), names); err != nil {
				return err
			}
			return a.print(map[string]any{"schema": a.schema, "slot": s, "publication": p, "dropped": true}, func(w io.Writer) {
				fmt.Fprintf(w, "dropped replication slot %s and publication %s of schema %s\n", s, p, a.schema)
			})
		},
	}
	status := &cobra.Command{
		Use:   "status",
		Short: "The log mode's slot: whether it exists, who reads it, and how much write-ahead log it holds",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, pool, err := a.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			s, p := resolved()
			ls, err := st.OutboxLogStatus(cmd.Context(), names)
			if err != nil {
				return err
			}
			type row struct {
				Schema            string `json:"schema"`
				WALLevel          string `json:"wal_level"`
				Slot              string `json:"slot"`
				SlotExists        bool   `json:"slot_exists"`
				Publication       string `json:"publication"`
				PublicationExists bool   `json:"publication_exists"`
				Active            bool   `json:"active"`
				ActivePID         int    `json:"active_pid,omitempty"`
				LagBytes          int64  `json:"lag_bytes"`
			}
			r := row{a.schema, ls.WALLevel, s, ls.SlotExists, p, ls.PublicationExists, ls.Active, ls.ActivePID, ls.LagBytes}
			return a.print(r, func(w io.Writer) {
				fmt.Fprintln(w, "SCHEMA\tWAL_LEVEL\tSLOT\tEXISTS\tPUBLICATION\tEXISTS\tACTIVE PID\tLAG BYTES")
				pid := "-"
				if r.Active {
					pid = fmt.Sprint(r.ActivePID)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%t\t%s\t%t\t%s\t%d\n", r.Schema, r.WALLevel, r.Slot, r.SlotExists, r.Publication, r.PublicationExists, pid, r.LagBytes)
			})
		},
	}
	cmd.PersistentFlags().StringVar(&names.Slot, "slot", "", "replication slot (default sagabox_<schema>, as the relay derives it)")
	cmd.PersistentFlags().StringVar(&names.Publication, "publication", "", "publication (default sagabox_<schema>)")
	cmd.AddCommand(setup, drop, status)
	return cmd
}
