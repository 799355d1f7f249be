package orchestrator

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/store/driver"
)

// StartKeyPolicy says what Start does when its StartOpts.StartKey already
// names a saga of the same definition name.
type StartKeyPolicy int

// The start-key policies.
const (
	// StartKeyRejectDifferent, the default: a start with the same data (as
	// JSON, whatever the order of object keys) is a repeat of the first
	// one and returns that saga with Started.Existing set; a start with
	// different data fails with a *StartKeyConflictError, wrapping
	// ErrStartKeyConflict, and writes nothing.
	StartKeyRejectDifferent StartKeyPolicy = iota
	// StartKeyReturnExisting returns the saga the key names, whatever the
	// data (the behaviour before policies existed).
	StartKeyReturnExisting
	// StartKeyReuseFinished starts a new saga when the saga the key names
	// has finished (completed, compensated or terminated), so that a key
	// such as a subscription id can run one saga at a time; the key then
	// names the new saga (GetByKey), the old one keeps it marked released
	// and gets a HistoryStartKeyReleased entry. While the saga it names has
	// not finished (a failed saga has not: an operator may still retry
	// it), the key behaves as with StartKeyRejectDifferent.
	StartKeyReuseFinished
)

// String returns the policy's name.
func (p StartKeyPolicy) String() string {
	switch p {
	case StartKeyRejectDifferent:
		return "reject-different"
	case StartKeyReturnExisting:
		return "return-existing"
	case StartKeyReuseFinished:
		return "reuse-finished"
	}
	return fmt.Sprintf("StartKeyPolicy(%d)", int(p))
}

// ErrStartKeyConflict is wrapped by the error of a Start whose start key
// names a saga started with different data (StartKeyRejectDifferent). It is
// saga.ErrStartKeyConflict.
var ErrStartKeyConflict = saga.ErrStartKeyConflict

// HistoryStartKeyReleased: a start with StartKeyReuseFinished gave this
// finished saga's start key to a new saga; Detail names it.
const HistoryStartKeyReleased saga.HistoryEvent = "start-key-released"

// StartKeyConflictError is the error of a Start whose start key names a saga
// started with different data. It wraps ErrStartKeyConflict.
type StartKeyConflictError struct {
	// Type is the definition name and StartKey the key.
	Type, StartKey string
	// Existing is the saga the key names, and Status its status.
	Existing uuid.UUID
	Status   saga.Status
}

// Error describes the conflict.
func (e *StartKeyConflictError) Error() string {
	return fmt.Sprintf("%s: start key %q names saga %s (%s), started with different data",
		saga.ErrStartKeyConflict, e.StartKey, e.Existing, e.Status)
}

// Unwrap returns ErrStartKeyConflict.
func (e *StartKeyConflictError) Unwrap() error { return saga.ErrStartKeyConflict }

// startDataHash returns the hash of data in a canonical form: object keys
// sorted, insignificant white space dropped, numbers as written.
func startDataHash(data json.RawMessage) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: saga data: %w", saga.ErrInvalidPayload, err)
	}
	canon, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode saga data: %w", err)
	}
	sum := sha256.Sum256(canon)
	return sum[:], nil
}

// existingStart is the outcome of a start whose key names rec, under
// policy: rec's saga, or a conflict. A saga started before its start data
// was kept (no hash) counts as started with the same data.
func (c *Client) existingStart(runner saga.Runner, rec *driver.SagaRecord, policy StartKeyPolicy, hash []byte) (*Started, error) {
	if policy != StartKeyReturnExisting && rec.StartDataHash != nil && !bytes.Equal(rec.StartDataHash, hash) {
		return nil, fmt.Errorf("orchestrator: start %s v%d: %w", runner.Name(), runner.Version(),
			&StartKeyConflictError{Type: rec.Type, StartKey: rec.StartKey, Existing: rec.ID, Status: saga.Status(rec.Status)})
	}
	return &Started{ID: rec.ID, Status: saga.Status(rec.Status), Existing: true}, nil
}

// releaseStartKey gives, under StartKeyReuseFinished, the key of the
// finished saga holding it to the saga id about to be started in tx.
func (c *Client) releaseStartKey(ctx context.Context, tx pgx.Tx, sagaType, key string, id uuid.UUID) error {
	_, err := c.db.SagaReleaseStartKey(ctx, tx, driver.StartKeyRelease{
		SagaType: sagaType, StartKey: key, Event: string(HistoryStartKeyReleased),
		Detail: fmt.Sprintf("start key %q given to saga %s", key, id), At: c.now(),
	})
	return err
}
