package store_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/store"
)

// Connect failures are told apart by SQLSTATE, never by message text.
func TestClassifyConnect(t *testing.T) {
	t.Parallel()
	wrap := func(code string) error {
		return fmt.Errorf("ping: %w", &pgconn.PgError{Code: code, Message: "whatever"})
	}
	require.Equal(t, store.ConnectAuthFailed, store.ClassifyConnect(wrap("28P01")))
	require.Equal(t, store.ConnectRoleRejected, store.ClassifyConnect(wrap("28000")))
	require.Equal(t, store.ConnectNoDatabase, store.ClassifyConnect(wrap("3D000")))
	require.Equal(t, store.ConnectUnreachable, store.ClassifyConnect(wrap("57P03")))
	require.Equal(t, store.ConnectOther, store.ClassifyConnect(wrap("42P01")))
	require.Equal(t, store.ConnectOther, store.ClassifyConnect(errors.New("password authentication failed")))
	require.Equal(t, store.ConnectOther, store.ClassifyConnect(nil))
}
