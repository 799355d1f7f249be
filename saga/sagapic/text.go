package sagapic

import (
	"fmt"
	"strings"

	"github.com/sagabox/sagabox/saga"
)

// flow is a shape as the text formats draw it: each node's id, and the
// edges of the order of the steps. The ids are ours, never a user's text:
// "start" and "finish" ("end" is a keyword of Mermaid), s<i> for node i,
// s<i>_<j> for branch j of group i, g<i> for the group, and a step's
// compensation c… after its step's id.
type flow struct {
	sh     saga.Shape
	states map[string]stepLook
	end    look
	endTxt string
	edges  [][2]string
}

func newFlow(sh saga.Shape, opts *GraphOpts) *flow {
	inst := opts.instance()
	f := &flow{sh: sh, states: states(inst)}
	f.end, f.endTxt = endLook(inst)
	// Each node's entry and exit ids: a step's own, a group's branches.
	prev := []string{"start"}
	for i, n := range sh.Nodes {
		var ids []string
		if n.Kind == saga.NodeParallel {
			for j := range n.Branches {
				ids = append(ids, branchID(i, j))
			}
		} else {
			ids = []string{nodeID(i)}
		}
		if len(ids) == 0 {
			ids = []string{groupID(i)} // an empty group: drawn as a node
		}
		for _, p := range prev {
			for _, q := range ids {
				f.edges = append(f.edges, [2]string{p, q})
			}
		}
		prev = ids
	}
	for _, p := range prev {
		f.edges = append(f.edges, [2]string{p, "finish"})
	}
	return f
}

func nodeID(i int) string      { return fmt.Sprintf("s%d", i) }
func branchID(i, j int) string { return fmt.Sprintf("s%d_%d", i, j) }
func groupID(i int) string     { return fmt.Sprintf("g%d", i) }
func compID(id string) string  { return "c" + strings.TrimPrefix(id, "s") }

// lookOf returns the look of step n's action and compensation, and
// whether each is in flight.
func (f *flow) lookOf(n saga.ShapeNode) (action, comp look, current, currentComp bool) {
	action, comp = lookPlain, lookPlainComp
	if f.states == nil {
		return action, comp, false, false
	}
	st, ok := f.states[n.Name]
	if !ok {
		return lookPending, lookPending, false, false
	}
	return st.action, st.comp, st.current && !st.currentComp, st.current && st.currentComp
}

// lines is the label of a step: its name, kind and badges.
func (l stepLabel) lines() []string {
	out := []string{l.title}
	for _, s := range []string{l.kind, l.badges} {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// GraphDOT writes sh as a Graphviz digraph (render it with `dot -Tsvg`):
// the same picture as GraphSVG, with each parallel group a cluster and
// each compensation a dashed node joined to its step by a dashed arrow
// pointing back at it.
func GraphDOT(sh saga.Shape, opts *GraphOpts) string {
	f := newFlow(sh, opts)
	var b strings.Builder
	title := fmt.Sprintf("%s v%d", sh.Name, sh.Version)
	fmt.Fprintf(&b, "digraph %s {\n", dotString("saga "+title))
	fmt.Fprintf(&b, "  graph [rankdir=TB, nodesep=0.5, ranksep=0.45, fontname=%s, fontsize=11];\n", dotString("Helvetica"))
	fmt.Fprintf(&b, "  node [shape=box, style=\"rounded,filled\", fillcolor=\"#ffffff\", color=%s, fontname=%s, fontsize=11];\n", dotString(flowColour), dotString("Helvetica"))
	fmt.Fprintf(&b, "  edge [color=%s, fontname=%s, fontsize=9];\n", dotString(flowColour), dotString("Helvetica"))
	fmt.Fprintf(&b, "  start [shape=oval, label=%s];\n", dotString(title))
	fmt.Fprintf(&b, "  finish [shape=oval, label=%s, fillcolor=%s, color=%s];\n", dotString(f.endTxt), dotString(f.end.fill), dotString(f.end.stroke))
	node := func(id string, n saga.ShapeNode, indent string) {
		action, comp, cur, curComp := f.lookOf(n)
		shape, style := "box", "rounded,filled"
		switch n.Kind {
		case saga.NodeLocal:
			shape, style = "box", "filled"
		case saga.NodeWait:
			shape = "hexagon"
			style = "filled"
		case saga.NodeStep:
		default:
			style = "rounded,dashed,filled"
		}
		pen := "1"
		if cur {
			pen = "3"
		}
		fmt.Fprintf(&b, "%s%s [shape=%s, style=%s, label=%s, tooltip=%s, fillcolor=%s, color=%s, penwidth=%s];\n",
			indent, id, shape, dotString(style), dotString(strings.Join(labelOf(n).lines(), "\n")), dotString(describe(n, nil)),
			dotString(action.fill), dotString(action.stroke), pen)
		if n.Compensation == "" {
			return
		}
		pen = "1"
		if curComp {
			pen = "3"
		}
		c := compID(id)
		stroke := comp.stroke
		if f.states == nil {
			stroke = compColour
		}
		fmt.Fprintf(&b, "%s%s [style=%s, label=%s, fillcolor=%s, color=%s, penwidth=%s];\n",
			indent, c, dotString("rounded,dashed,filled"), dotString(strings.Join(compLabel(n).lines(), "\n")), dotString(comp.fill), dotString(stroke), pen)
		fmt.Fprintf(&b, "%s{ rank=same; %s; %s; }\n", indent, id, c)
		fmt.Fprintf(&b, "%s%s -> %s [style=dashed, color=%s, label=\"undo\", fontcolor=%s, constraint=false];\n", indent, c, id, dotString(compColour), dotString(compColour))
	}
	for i, n := range sh.Nodes {
		if n.Kind != saga.NodeParallel {
			node(nodeID(i), n, "  ")
			continue
		}
		fmt.Fprintf(&b, "  subgraph cluster_%d {\n    label=%s; style=\"dashed,rounded\"; color=\"#9ca3af\";\n", i, dotString("parallel: "+n.Name))
		if len(n.Branches) == 0 {
			fmt.Fprintf(&b, "    %s [label=%s];\n", groupID(i), dotString("(no branch)"))
		}
		for j, br := range n.Branches {
			node(branchID(i, j), br, "    ")
		}
		b.WriteString("  }\n")
	}
	for _, e := range f.edges {
		fmt.Fprintf(&b, "  %s -> %s;\n", e[0], e[1])
	}
	b.WriteString("}\n")
	return b.String()
}

// GraphMermaid writes sh as a Mermaid flowchart (GitHub and many wikis
// render it in a ```mermaid block): the same picture as GraphSVG, with
// each parallel group a subgraph and each compensation joined to its step
// by a dotted arrow pointing back at it. With an instance, each node gets
// a class for its state (classDef done, active, failed, compensated,
// skipped, pending, terminated, current).
func GraphMermaid(sh saga.Shape, opts *GraphOpts) string {
	f := newFlow(sh, opts)
	var b strings.Builder
	label := func(lines []string) string {
		esc := make([]string, len(lines))
		for i, l := range lines {
			esc[i] = mermaidText(l)
		}
		return `"` + strings.Join(esc, "<br/>") + `"`
	}
	classes := map[string][]string{}
	b.WriteString("flowchart TB\n")
	fmt.Fprintf(&b, "  start((%s))\n", label([]string{fmt.Sprintf("%s v%d", sh.Name, sh.Version)}))
	fmt.Fprintf(&b, "  finish((%s))\n", label([]string{f.endTxt}))
	if f.states != nil && f.end.class != "" {
		classes[f.end.class] = append(classes[f.end.class], "finish")
	}
	node := func(id string, n saga.ShapeNode, indent string) {
		open, close := "(", ")"
		switch n.Kind {
		case saga.NodeLocal:
			open, close = "[[", "]]"
		case saga.NodeWait:
			open, close = "{{", "}}"
		case saga.NodeStep:
		default:
			open, close = "[", "]"
		}
		fmt.Fprintf(&b, "%s%s%s%s%s\n", indent, id, open, label(labelOf(n).lines()), close)
		action, comp, cur, curComp := f.lookOf(n)
		if f.states != nil {
			classes[action.class] = append(classes[action.class], id)
			if cur {
				classes["current"] = append(classes["current"], id)
			}
		}
		if n.Compensation == "" {
			return
		}
		c := compID(id)
		fmt.Fprintf(&b, "%s%s[%s]\n", indent, c, label(compLabel(n).lines()))
		if f.states != nil {
			classes[comp.class] = append(classes[comp.class], c)
			if curComp {
				classes["current"] = append(classes["current"], c)
			}
		} else {
			classes["compensation"] = append(classes["compensation"], c)
		}
	}
	var undo []string
	for i, n := range sh.Nodes {
		if n.Kind != saga.NodeParallel {
			node(nodeID(i), n, "  ")
			if n.Compensation != "" {
				undo = append(undo, nodeID(i))
			}
			continue
		}
		fmt.Fprintf(&b, "  subgraph %s [%s]\n", groupID(i)+"_group", label([]string{"parallel: " + n.Name}))
		if len(n.Branches) == 0 {
			fmt.Fprintf(&b, "    %s[%s]\n", groupID(i), label([]string{"(no branch)"}))
		}
		for j, br := range n.Branches {
			node(branchID(i, j), br, "    ")
			if br.Compensation != "" {
				undo = append(undo, branchID(i, j))
			}
		}
		b.WriteString("  end\n")
	}
	for _, e := range f.edges {
		fmt.Fprintf(&b, "  %s --> %s\n", e[0], e[1])
	}
	for _, id := range undo {
		fmt.Fprintf(&b, "  %s -. undo .-> %s\n", compID(id), id)
	}
	defs := []struct {
		class string
		l     look
	}{{"pending", lookPending}, {"active", lookActive}, {"done", lookDone}, {"skipped", lookSkipped}, {"failed", lookFailed},
		{"terminated", lookTerminated}, {"compensated", lookCompensated}, {"compensation", lookPlainComp}}
	for _, d := range defs {
		if len(classes[d.class]) == 0 {
			continue
		}
		fmt.Fprintf(&b, "  classDef %s fill:%s,stroke:%s\n", d.class, d.l.fill, d.l.stroke)
		fmt.Fprintf(&b, "  class %s %s\n", strings.Join(classes[d.class], ","), d.class)
	}
	if ids := classes["current"]; len(ids) > 0 {
		fmt.Fprintf(&b, "  classDef current stroke:%s,stroke-width:3px\n", highlight)
		fmt.Fprintf(&b, "  class %s current\n", strings.Join(ids, ","))
	}
	return b.String()
}
