package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/view"
	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/saga/sagapic"
)

// graphFormats are the formats of `saga graph`, each a sagapic renderer.
var graphFormats = map[string]func(saga.Shape, *sagapic.GraphOpts) string{
	"svg":     sagapic.GraphSVG,
	"dot":     sagapic.GraphDOT,
	"mermaid": sagapic.GraphMermaid,
}

func (a *app) sagaDefinitionsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "definitions",
		Short: "List the saga definitions the orchestrators of the schema recorded when they started",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, closeDB, err := a.client(cmd.Context())
			if err != nil {
				return err
			}
			defer closeDB()
			defs, err := c.Definitions(cmd.Context())
			if err != nil {
				return err
			}
			out := view.DefinitionList{Schema: a.schema, Definitions: make([]view.Definition, len(defs))}
			for i := range defs {
				out.Definitions[i] = view.DefinitionOf(&defs[i])
			}
			return a.print(out, func(w io.Writer) {
				fmt.Fprintln(w, "TYPE\tVERSION\tSTEPS\tREGISTERED\tLAST SEEN")
				for _, d := range out.Definitions {
					fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\n", d.Type, d.Version, d.Steps, fmtTime(d.RegisteredAt), fmtTime(d.SeenAt))
				}
				if len(out.Definitions) == 0 {
					fmt.Fprintf(w, "(none: an orchestrator records the definitions it runs when it starts)\n")
				}
			})
		},
	}
	return withJSON(cmd)
}

func (a *app) sagaGraphCommand() *cobra.Command {
	var version int
	var format, sagaID string
	cmd := &cobra.Command{
		Use:   "graph {NAME [--version N] | --saga SAGA_ID} [--format svg|dot|mermaid]",
		Short: "Draw a saga definition as a graph (SVG, Graphviz DOT or Mermaid), from the shape its orchestrator recorded",
		Long: `Draw a saga definition as a graph: its steps in order, parallel groups side by side, each
step's compensation beside it, waits, local steps, timeouts and retries. The shape comes from the
schema (an orchestrator records those of its definitions when it starts), so no Go code is needed.
NAME draws the latest recorded version, --version N another one; --saga draws the definition of
that saga with its steps coloured by their state and its current step highlighted.

  sagabox saga graph checkout > checkout.svg
  sagabox saga graph checkout --version 1 --format dot | dot -Tpng > checkout.png
  sagabox saga graph checkout --format mermaid`,
		Args: func(_ *cobra.Command, args []string) error {
			switch {
			case sagaID == "" && len(args) != 1:
				return withCode(ExitUsage, errors.New("name the definition: NAME, or --saga SAGA_ID"))
			case sagaID != "" && len(args) != 0:
				return withCode(ExitUsage, errors.New("name the definition by NAME or by --saga, not both"))
			case sagaID != "" && version != 0:
				return withCode(ExitUsage, errors.New("--version goes with NAME: --saga draws the saga's own version"))
			case sagaID != "":
				_, err := parseID(sagaID)
				return err
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			render, ok := graphFormats[format]
			if !ok {
				return withCode(ExitUsage, fmt.Errorf("--format %q: want svg, dot or mermaid", format))
			}
			if version < 0 {
				return withCode(ExitUsage, fmt.Errorf("--version %d: want a positive version", version))
			}
			ctx := cmd.Context()
			c, _, closeDB, err := a.client(ctx)
			if err != nil {
				return err
			}
			defer closeDB()
			var opts *sagapic.GraphOpts
			name := ""
			if len(args) == 1 {
				name = args[0]
			} else {
				s, err := a.resolveSaga(ctx, c, []string{sagaID}, "", "")
				if err != nil {
					return err
				}
				inst := s.Instance()
				opts = &sagapic.GraphOpts{Instance: &inst}
				name, version = s.Type, s.Version
			}
			d, err := a.definition(ctx, c, name, version)
			if err != nil {
				return err
			}
			if a.json {
				return a.print(view.DefinitionOf(d), nil)
			}
			_, err = io.WriteString(a.stdout, render(d.Shape, opts))
			return err
		},
	}
	cmd.Flags().IntVar(&version, "version", 0, "the definition's version (default: the latest recorded)")
	cmd.Flags().StringVar(&format, "format", "svg", "svg, dot (Graphviz) or mermaid; --json prints the recorded shape instead")
	cmd.Flags().StringVar(&sagaID, "saga", "", "draw this saga's definition, coloured by the saga's state")
	return withJSON(cmd)
}

// definition returns the definition name recorded at version (0: the
// latest), or an error that lists what is recorded.
func (a *app) definition(ctx context.Context, c *orchestrator.Client, name string, version int) (*orchestrator.RecordedDefinition, error) {
	d, err := c.Definition(ctx, name, version)
	if err == nil {
		return d, nil
	}
	if !errors.Is(err, orchestrator.ErrNotFound) {
		return nil, err
	}
	all, lerr := c.Definitions(ctx)
	if lerr != nil {
		return nil, lerr
	}
	if len(all) == 0 {
		return nil, withCode(ExitNotFound, fmt.Errorf("no saga definition is recorded in schema %s: an orchestrator records the definitions it runs when it starts (since the saga migration 11); start one, or check --schema", a.schema))
	}
	var versions []string
	byName := map[string][]string{}
	var names []string
	for _, r := range all {
		if _, seen := byName[r.Type]; !seen {
			names = append(names, r.Type)
		}
		byName[r.Type] = append(byName[r.Type], strconv.Itoa(r.Version))
		if r.Type == name {
			versions = append(versions, strconv.Itoa(r.Version))
		}
	}
	if len(versions) > 0 {
		return nil, withCode(ExitNotFound, fmt.Errorf("saga definition %q has no version %d recorded in schema %s; recorded versions: %s",
			name, version, a.schema, strings.Join(versions, ", ")))
	}
	known := make([]string, len(names))
	for i, n := range names {
		known[i] = fmt.Sprintf("%s (v%s)", n, strings.Join(byName[n], ", v"))
	}
	return nil, withCode(ExitNotFound, fmt.Errorf("no saga definition %q is recorded in schema %s; recorded: %s (see `sagabox saga definitions`)",
		name, a.schema, strings.Join(known, ", ")))
}

func (a *app) sagaTimelineCommand() *cobra.Command {
	var key, sagaType, format string
	cmd := &cobra.Command{
		Use:   "timeline {SAGA_ID | --key START_KEY [--type TYPE]} [--format svg]",
		Short: "Draw a saga's run as an SVG timeline: a bar per attempt of each step and compensation, from its history",
		Long: `Draw a saga's run as a Gantt-like SVG timeline, from its history: one row per step and per
compensation, a bar per attempt from the command sent to the reply applied, the backoff before a
retry, waits for outside events, local steps and operator actions; what is still in flight runs
to now.

  sagabox saga timeline 0190c0de-0000-7000-8000-000000000001 > saga.svg`,
		Args: sagaArgs(&key),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "svg" {
				return withCode(ExitUsage, fmt.Errorf("--format %q: want svg", format))
			}
			ctx := cmd.Context()
			c, _, closeDB, err := a.client(ctx)
			if err != nil {
				return err
			}
			defer closeDB()
			s, err := a.resolveSaga(ctx, c, args, key, sagaType)
			if err != nil {
				return err
			}
			hist, err := c.History(ctx, s.ID)
			if err != nil {
				return err
			}
			_, err = io.WriteString(a.stdout, sagapic.TimelineSVG(s.Instance(), hist, &sagapic.TimelineOpts{Now: time.Now()}))
			return err
		},
	}
	cmd.Flags().StringVar(&key, "key", "", "the saga's start key instead of its id")
	cmd.Flags().StringVar(&sagaType, "type", "", "with --key: the saga's type, when sagas of several types share the key")
	cmd.Flags().StringVar(&format, "format", "svg", "svg (the only format)")
	return cmd
}
