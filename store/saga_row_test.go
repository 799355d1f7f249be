package store

import (
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// A receipt's saga carries every column of the table to the one mapper: a
// column added to sagabox_saga (and so to both of sqlc's row types) that
// receivedSaga forgets fails here.
func TestReceivedSagaCarriesEveryColumn(t *testing.T) {
	t.Parallel()
	var r dbsqlc.SagaReceiveRow
	fill(t, reflect.ValueOf(&r).Elem())
	got := reflect.ValueOf(receivedSaga(&r)).Elem()
	for i := range got.NumField() {
		require.False(t, got.Field(i).IsZero(), "receivedSaga leaves SagaboxSaga.%s unset", got.Type().Field(i).Name)
	}
}

// fill sets every field of v, recursively, to a value that is not zero.
func fill(t *testing.T, v reflect.Value) {
	t.Helper()
	if v.Type() == reflect.TypeFor[time.Time]() {
		v.Set(reflect.ValueOf(time.Unix(1, 0)))
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(t, v.Field(i))
			}
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem())
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(t, v.Index(0))
	case reflect.Array:
		fill(t, v.Index(0))
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	default:
		t.Fatalf("fill: no value for a %s", v.Type())
	}
}
