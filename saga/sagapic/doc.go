// Package sagapic draws sagas: a definition's shape (saga.Shape) as a graph
// in SVG, Graphviz DOT or Mermaid, optionally coloured by the state of one
// saga with its current step highlighted, and a saga's run as a timeline
// (SVG, Gantt-like) drawn from its history.
//
// It is pure, like package saga: it reads no clock, does no I/O and needs
// nothing at run time, no JavaScript and no fonts or libraries fetched by
// the page. The SVG is self-contained: presentation attributes only, no
// style element or attribute and no script, so that a page with a strict
// Content-Security-Policy (the web console's: style-src 'self', script-src
// 'none') can inline it. Every name and detail is escaped for the format it
// goes into: step, command and event names, history details and actors come
// from users.
//
// The orchestrator records each definition's shape when it starts, so the
// sagabox command (`sagabox saga graph`, `sagabox saga timeline`) and the
// web console draw sagas without their Go code. Call this package directly
// to draw a definition in a test, a README or an application's own pages:
//
//	svg := sagapic.GraphSVG(checkout.Shape(), nil)
//	dot := sagapic.GraphDOT(checkout.Shape(), nil)
package sagapic
