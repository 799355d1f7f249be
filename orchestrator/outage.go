package orchestrator

import (
	"sync"
	"time"
)

// OutageRecoveryGrace is how long after a broker outage ends step deadlines
// keep waiting, on top of the outage's length: the participants reconnect
// within their broker's reconnect backoff (rabbitmq.DefaultReconnectMax,
// 10s) and then publish the replies that waited in their outboxes.
const OutageRecoveryGrace = 15 * time.Second

// outageClock keeps the time the broker was away out of step timeouts. A
// participant cannot answer through a broker that is down (its reply may
// be waiting in its outbox), so while the broker is unreachable no deadline
// fires, and once it is back, deadlines are compared with a clock that runs
// behind by the length of the outage, for as long as the outage lasted:
// a deadline that passed during the outage fires that much later, and the
// clock then catches up. The clock also runs behind by grace more: the
// participants need that long after the broker is back to reconnect (their
// reconnect backoff) and to publish the replies that waited in their
// outboxes, so a command sent just before the outage is not timed out for
// an answer that could not come yet.
type outageClock struct {
	// grace is the time after an outage given to the participants to
	// recover, added to the outage's length.
	grace time.Duration

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
		d := now.Sub(o.downSince) + o.grace
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
