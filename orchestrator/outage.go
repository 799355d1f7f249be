package orchestrator

import (
	"sync"
	"time"
)

// outageClock keeps the time the broker was away out of step timeouts. A
// participant cannot answer through a broker that is down (its reply may
// be waiting in its outbox), so while the broker is unreachable no deadline
// fires, and once it is back, deadlines are compared with a clock that runs
// behind by the length of the outage, for as long as the outage lasted:
// a deadline that passed during the outage fires that much later, and the
// clock then catches up.
type outageClock struct {
	mu sync.Mutex
	// downSince is when the broker was first seen unreachable, while it is.
	downSince time.Time
	// credit is how far behind the clock runs, until creditUntil.
	credit      time.Duration
	creditUntil time.Time
}

// at returns the time to compare deadlines with at now, given since when
// the broker has been unreachable (zero: it is up), and whether deadlines
// are paused (the broker is down).
func (o *outageClock) at(now, unavailableSince time.Time) (effective time.Time, paused bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !unavailableSince.IsZero() {
		if o.downSince.IsZero() || unavailableSince.Before(o.downSince) {
			o.downSince = unavailableSince
		}
		return now, true
	}
	if !o.downSince.IsZero() {
		d := now.Sub(o.downSince)
		if left := o.creditUntil.Sub(now); left > 0 {
			// Back-to-back outages add up.
			d += min(o.credit, left)
		}
		o.credit, o.creditUntil, o.downSince = d, now.Add(d), time.Time{}
	}
	if now.Before(o.creditUntil) {
		return now.Add(-o.credit), false
	}
	o.credit = 0
	return now, false
}
