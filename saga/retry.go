package saga

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Retry policy defaults, applied by RetryPolicy.WithDefaults to zero fields.
const (
	// DefaultInitialInterval is the default delay before the second attempt.
	DefaultInitialInterval = time.Second
	// DefaultBackoffCoefficient is the default growth factor of the delay
	// between attempts.
	DefaultBackoffCoefficient = 2.0
	// DefaultMaximumIntervalFactor is the default cap on the delay between
	// attempts, as a multiple of InitialInterval.
	DefaultMaximumIntervalFactor = 100
	// DefaultMaxAttempts is the default number of attempts: one, so a step
	// that times out is compensated without being re-sent.
	DefaultMaxAttempts = 1
)

// RetryPolicy says how often a step's command is re-sent after its timeout
// expires, and how long the orchestrator waits before each re-send. Its
// vocabulary is Temporal's. The zero value means "use the defaults".
//
// Retries are triggered only by a step's timeout: a failure reply is a
// business rejection and is never retried, and transient errors are retried
// by the participant itself before it replies. A step that allows more than
// one attempt must therefore have a timeout.
//
// There is no jitter: the core is deterministic, and the delays are long
// compared with the broker's own scheduling noise.
type RetryPolicy struct {
	// InitialInterval is the delay between the timeout of the first attempt
	// and the second attempt. Defaults to DefaultInitialInterval.
	InitialInterval time.Duration `json:"initial_interval,omitempty"`
	// BackoffCoefficient multiplies the delay after each further attempt; it
	// must be at least 1. Defaults to DefaultBackoffCoefficient.
	BackoffCoefficient float64 `json:"backoff_coefficient,omitempty"`
	// MaximumInterval caps the delay between attempts; it must not be less
	// than InitialInterval. Defaults to DefaultMaximumIntervalFactor ×
	// InitialInterval.
	MaximumInterval time.Duration `json:"maximum_interval,omitempty"`
	// MaxAttempts is the total number of times the command is sent, the
	// first included. Defaults to DefaultMaxAttempts (no re-send).
	MaxAttempts int `json:"max_attempts,omitempty"`
}

// WithDefaults returns a copy of p with every zero field set to its default.
func (p RetryPolicy) WithDefaults() RetryPolicy {
	if p.InitialInterval == 0 {
		p.InitialInterval = DefaultInitialInterval
	}
	if p.BackoffCoefficient == 0 {
		p.BackoffCoefficient = DefaultBackoffCoefficient
	}
	if p.MaximumInterval == 0 {
		p.MaximumInterval = DefaultMaximumIntervalFactor * p.InitialInterval
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	return p
}

// Validate reports the fields of p that are out of range, each error naming
// its field. Zero fields are valid (they take their default).
func (p RetryPolicy) Validate() error {
	var errs []error
	if p.InitialInterval < 0 {
		errs = append(errs, fmt.Errorf("retry policy InitialInterval %s is negative", p.InitialInterval))
	}
	if p.BackoffCoefficient != 0 && (p.BackoffCoefficient < 1 || math.IsNaN(p.BackoffCoefficient) || math.IsInf(p.BackoffCoefficient, 0)) {
		errs = append(errs, fmt.Errorf("retry policy BackoffCoefficient %g is less than 1 or not finite", p.BackoffCoefficient))
	}
	if p.MaximumInterval < 0 {
		errs = append(errs, fmt.Errorf("retry policy MaximumInterval %s is negative", p.MaximumInterval))
	} else if d := p.WithDefaults(); p.MaximumInterval != 0 && p.MaximumInterval < d.InitialInterval {
		errs = append(errs, fmt.Errorf("retry policy MaximumInterval %s is less than InitialInterval %s", p.MaximumInterval, d.InitialInterval))
	}
	if p.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("retry policy MaxAttempts %d is negative", p.MaxAttempts))
	}
	return errors.Join(errs...)
}

// Backoff returns how long to wait after attempt number attempt (1 for the
// first send) timed out before sending attempt+1: InitialInterval ×
// BackoffCoefficient^(attempt-1), capped at MaximumInterval. Zero fields take
// their defaults. It is deterministic and never negative; attempt < 1 counts
// as 1.
func (p RetryPolicy) Backoff(attempt int) time.Duration {
	p = p.WithDefaults()
	if attempt < 1 {
		attempt = 1
	}
	d := float64(p.InitialInterval) * math.Pow(p.BackoffCoefficient, float64(attempt-1))
	if math.IsNaN(d) || d >= float64(p.MaximumInterval) {
		return p.MaximumInterval
	}
	return time.Duration(d)
}
