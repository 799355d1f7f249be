package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"time"

	"github.com/sagabox/sagabox/orchestrator"
	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/saga/sagapic"
)

// pictures are a saga's definition graph and its timeline, drawn on the
// server as SVG and inlined in its page: nothing is fetched and no script
// runs, so the page's Content-Security-Policy stays strict (sagapic's SVG
// has no style attribute or element).
type pictures struct {
	// Graph is the definition's graph, coloured by the saga's state with
	// its current step highlighted; empty when its shape is not recorded,
	// and GraphNote says why.
	Graph     template.HTML
	GraphNote string
	// Timeline is the saga's run, from its history.
	Timeline template.HTML
}

// picturesOf draws saga s, whose history is hist.
func (c *console) picturesOf(ctx context.Context, s *orchestrator.Saga, hist []saga.HistoryEntry) pictures {
	inst := s.Instance()
	// sagapic escapes every text it writes (names, details and actors are
	// users'), so its SVG is safe as HTML.
	p := pictures{Timeline: template.HTML(sagapic.TimelineSVG(inst, hist, &sagapic.TimelineOpts{Now: time.Now()}))}
	d, err := c.orch.Definition(ctx, s.Type, s.Version)
	switch {
	case errors.Is(err, orchestrator.ErrNotFound):
		p.GraphNote = fmt.Sprintf("No shape of %s v%d is recorded in schema %s: an orchestrator records the shapes of the definitions it runs when it starts.",
			s.Type, s.Version, c.cfg.Schema)
	case err != nil:
		c.log.Error("read the definition of a saga", "saga_id", s.ID.String(), "saga_type", s.Type, "version", s.Version, "err", err)
		p.GraphNote = "The definition could not be read: " + err.Error()
	default:
		p.Graph = template.HTML(sagapic.GraphSVG(d.Shape, &sagapic.GraphOpts{Instance: &inst}))
	}
	return p
}
