package saga_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sagabox/sagabox/saga"
)

func TestCommandRoundTrip(t *testing.T) {
	t.Parallel()
	require.Equal(t, "inventory.reserve", reserve.Name())
	require.Equal(t, "inventory.reserve", reserve.String())

	b, err := reserve.EncodeRequest(ReserveReq{OrderID: "o-1"})
	require.NoError(t, err)
	require.Equal(t, `{"order_id":"o-1"}`, string(b))
	req, err := reserve.DecodeRequest(b)
	require.NoError(t, err)
	require.Equal(t, ReserveReq{OrderID: "o-1"}, req)

	b, err = reserve.EncodeReply(ReserveReply{ReservationID: "r-1"})
	require.NoError(t, err)
	reply, err := reserve.DecodeReply(b)
	require.NoError(t, err)
	require.Equal(t, ReserveReply{ReservationID: "r-1"}, reply)

	b, err = release.EncodeReply(saga.None{})
	require.NoError(t, err)
	require.Equal(t, `{}`, string(b))
	_, err = release.DecodeReply(b)
	require.NoError(t, err)
	_, err = release.DecodeReply([]byte(" null \n"))
	require.NoError(t, err)
}

func TestCommandDecodeIsStrict(t *testing.T) {
	t.Parallel()
	tests := []struct {
		payload string
		want    string
	}{
		{`{"order":"o-1"}`, `invalid payload: decode inventory.reserve request: json: unknown field "order"`},
		{`{"order_id":"o-1"} {"order_id":"o-2"}`, `invalid payload: decode inventory.reserve request: trailing data after the JSON value`},
		{`{"order_id":"o-1"}]`, `invalid payload: decode inventory.reserve request: trailing data after the JSON value`},
		{``, `invalid payload: decode inventory.reserve request: empty payload`},
		{`{"order_id":1}`, `invalid payload: decode inventory.reserve request: json: cannot unmarshal number into Go struct field ReserveReq.order_id of type string`},
		{`[]`, `invalid payload: decode inventory.reserve request: json: cannot unmarshal array into Go value of type saga_test.ReserveReq`},
		{`{"order_id":`, `invalid payload: decode inventory.reserve request: unexpected EOF`},
	}
	for _, tt := range tests {
		_, err := reserve.DecodeRequest([]byte(tt.payload))
		require.ErrorIs(t, err, saga.ErrInvalidPayload, tt.payload)
		require.EqualError(t, err, tt.want, tt.payload)
	}
	_, err := release.DecodeReply([]byte(`{"extra":1}`))
	require.EqualError(t, err, `invalid payload: decode inventory.release reply: json: unknown field "extra"`)
	_, err = reserve.DecodeRequest([]byte(" {\"order_id\":\"o\"}\n\t "))
	require.NoError(t, err, "surrounding white space is fine")
}

func TestCommandEncodeError(t *testing.T) {
	t.Parallel()
	bad := saga.NewCommand[chan int, saga.None]("bad.cmd")
	_, err := bad.EncodeRequest(make(chan int))
	require.EqualError(t, err, "encode bad.cmd request: json: unsupported type: chan int")
}

func TestFailurePayload(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(saga.Failure{Reason: "insufficient stock"})
	require.NoError(t, err)
	require.Equal(t, `{"reason":"insufficient stock"}`, string(b))
	f, err := saga.DecodeFailure([]byte(`{"reason":"r","code":"c","later":true}`))
	require.NoError(t, err)
	require.Equal(t, saga.Failure{Reason: "r", Code: "c"}, f)
	_, err = saga.DecodeFailure([]byte(`"r"`))
	require.ErrorIs(t, err, saga.ErrInvalidPayload)
}

func TestReject(t *testing.T) {
	t.Parallel()
	require.NoError(t, saga.Reject(nil))
	base := errors.New("insufficient funds")
	err := saga.Reject(base)
	require.EqualError(t, err, "insufficient funds")
	require.ErrorIs(t, err, saga.ErrRejected)
	require.ErrorIs(t, err, base)
	wrapped := fmt.Errorf("charge: %w", err)
	require.ErrorIs(t, wrapped, saga.ErrRejected)
	require.NotErrorIs(t, base, saga.ErrRejected)
}
