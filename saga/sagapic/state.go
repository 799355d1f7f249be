package sagapic

import "github.com/sagabox/sagabox/saga"

// look is how a box is drawn: its state class, fill and stroke.
type look struct {
	class, fill, stroke, text string
}

var (
	lookPlain       = look{"", "#ffffff", "#4b5563", "#111827"}
	lookPlainComp   = look{"", "#fffbeb", "#b45309", "#111827"}
	lookPending     = look{"pending", "#ffffff", "#9ca3af", "#374151"}
	lookActive      = look{"active", "#dbeafe", "#2563eb", "#111827"}
	lookDone        = look{"done", "#dcfce7", "#16a34a", "#111827"}
	lookSkipped     = look{"skipped", "#f3f4f6", "#9ca3af", "#6b7280"}
	lookFailed      = look{"failed", "#fee2e2", "#dc2626", "#111827"}
	lookTerminated  = look{"terminated", "#e5e7eb", "#4b5563", "#111827"}
	lookCompensated = look{"compensated", "#fef3c7", "#d97706", "#111827"}
)

// stepLook is what the state of one step in a saga makes of its boxes.
type stepLook struct {
	status saga.StepStatus
	action look
	comp   look
	// current marks the step in flight; currentComp says that what is in
	// flight is its compensation.
	current, currentComp bool
}

// states returns the look of each step of inst by name, and that of the
// saga's end; nil without an instance.
func states(inst *saga.Instance) map[string]stepLook {
	if inst == nil {
		return nil
	}
	out := make(map[string]stepLook, len(inst.Steps))
	for _, st := range inst.Steps {
		l := stepLook{status: st.Status, action: lookPending, comp: lookPending}
		switch st.Status {
		case saga.StepRunning, saga.StepWaitingRetry, saga.StepWaitingEvent:
			l.action = lookActive
		case saga.StepSucceeded:
			l.action = lookDone
		case saga.StepSkipped:
			l.action, l.comp = lookSkipped, lookSkipped
		case saga.StepRejected, saga.StepTimedOut, saga.StepAborted:
			l.action = lookFailed
		case saga.StepTerminated:
			l.action = lookTerminated
			if st.CompensationAttempt > 0 {
				l.action, l.comp = lookDone, lookTerminated
			}
		case saga.StepCompensating:
			l.action, l.comp = lookDone, lookActive
		case saga.StepCompensated:
			l.action, l.comp = lookDone, lookCompensated
		case saga.StepCompensationFailed:
			l.action, l.comp = lookDone, lookFailed
		}
		out[st.Name] = l
	}
	// The step in flight, and the branches of its group in flight with it.
	if inst.Status == saga.StatusRunning || inst.Status == saga.StatusCompensating || inst.Status == saga.StatusFailed {
		if i := inst.CurrentStep; i >= 0 && i < len(inst.Steps) {
			cur := inst.Steps[i]
			for _, st := range inst.Steps {
				if st.Name != cur.Name && (cur.Group == "" || st.Group != cur.Group || !inFlight(st.Status)) {
					continue
				}
				l := out[st.Name]
				l.current = true
				l.currentComp = st.Status == saga.StepCompensating || st.Status == saga.StepCompensationFailed
				out[st.Name] = l
			}
		}
	}
	return out
}

// inFlight reports whether a step in status is the saga's business now.
func inFlight(s saga.StepStatus) bool {
	switch s {
	case saga.StepRunning, saga.StepWaitingRetry, saga.StepWaitingEvent, saga.StepCompensating, saga.StepCompensationFailed:
		return true
	}
	return false
}

// endLook is the look of the saga's end: its status once it has one.
func endLook(inst *saga.Instance) (look, string) {
	if inst == nil {
		return lookPlain, "end"
	}
	switch inst.Status {
	case saga.StatusCompleted:
		return lookDone, string(inst.Status)
	case saga.StatusCompensated:
		return lookCompensated, string(inst.Status)
	case saga.StatusFailed:
		return lookFailed, string(inst.Status)
	case saga.StatusTerminated:
		return lookTerminated, string(inst.Status)
	}
	return lookPending, "end"
}
