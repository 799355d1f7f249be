package orchestrator

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/store/driver"
)

// The saga cache keeps the most recently used sagas up to its size, the
// last write of each, and only sagas that still run.
func TestSagaCacheKeepsRecentRunningSagas(t *testing.T) {
	t.Parallel()
	c := newSagaCache(2)
	rec := func(status string, rev int64) *driver.SagaRecord {
		return &driver.SagaRecord{ID: uuid.New(), Status: status, Revision: rev}
	}
	a, b, d := rec("running", 1), rec("compensating", 1), rec("running", 1)
	c.put(a)
	c.put(b)
	_, ok := c.get(a.ID) // a is now the most recent
	require.True(t, ok)
	c.put(d)
	require.Equal(t, 2, c.len())
	_, ok = c.get(b.ID)
	require.False(t, ok, "the least recently used saga went out")

	a.Revision = 2
	c.put(a)
	got, ok := c.get(a.ID)
	require.True(t, ok)
	require.Equal(t, int64(2), got.Revision, "the last write is kept")

	a.Data = []byte(`{"qty":1}`)
	c.put(a)
	a.Data[7] = '9' // the caller's bytes, changed after the put
	got, _ = c.get(a.ID)
	require.JSONEq(t, `{"qty":1}`, string(got.Data), "the cache keeps its own copy")

	a.Status = "completed"
	c.put(a)
	_, ok = c.get(a.ID)
	require.False(t, ok, "a finished saga is dropped")
	c.forget(d.ID)
	require.Zero(t, c.len())

	none := newSagaCache(-1)
	none.put(rec("running", 1))
	_, ok = none.get(uuid.New())
	require.False(t, ok)
	require.Zero(t, none.len())
}
