package saga

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// None is the payload of a command that has no request or reply data. It
// encodes as {}.
type None struct{}

// Failure is the payload of a failure reply, shared by participants (which
// send it when they reject a command or cannot compensate) and the
// orchestrator (which records Reason as the saga's LastError).
type Failure struct {
	// Reason says why, for humans: "insufficient stock".
	Reason string `json:"reason"`
	// Code is an optional machine-readable reason: "out_of_stock".
	Code string `json:"code,omitempty"`
}

// Codes of the failure replies (Failure.Code) that sagabox sends on its
// own, as opposed to a participant handler's rejection.
const (
	// CodeDeadLettered: processing the command kept failing and it was
	// given up on (dead-lettered) after its bounded attempts.
	CodeDeadLettered = "dead-lettered"
	// CodeInvalidPayload: the payload did not decode into the request type.
	CodeInvalidPayload = "invalid-payload"
	// CodeUnknownType: no handler is registered for the message's type.
	CodeUnknownType = "unknown-type"
	// CodePayloadTooLarge: the payload is over the receiver's limit.
	CodePayloadTooLarge = "payload-too-large"
	// CodeCompensatedBeforeRun: the action arrived after the compensation
	// of its step (a "hanging action") and was not applied.
	CodeCompensatedBeforeRun = "compensated-before-run"
)

// DecodeFailure decodes a failure reply payload. Unlike the command
// decoders it tolerates unknown fields, so that Failure can grow without
// breaking older orchestrators.
func DecodeFailure(payload []byte) (Failure, error) {
	var f Failure
	if err := json.Unmarshal(payload, &f); err != nil {
		return Failure{}, fmt.Errorf("%w: decode failure reply: %w", ErrInvalidPayload, err)
	}
	return f, nil
}

// Command is the contract of one command that a participant handles: a
// stable name (the message type, e.g. "inventory.reserve"), a request type
// and a reply type. Define each contract once, in a package shared by the
// saga definition and the participant, and use it on both sides:
//
//	var Reserve = saga.NewCommand[ReserveRequest, ReserveReply]("inventory.reserve")
//
// A success reply carries the same message type as the command it answers.
// Use None as Reply for a command whose success reply has no data. A
// Command is a small value; copy it freely.
type Command[Req, Reply any] struct {
	name string
}

// NewCommand returns the contract of the command called name. The name is
// validated when a definition using it is built (it must not be empty).
func NewCommand[Req, Reply any](name string) Command[Req, Reply] {
	return Command[Req, Reply]{name: name}
}

// Name returns the command's stable name, used as the message type of the
// command and of its replies.
func (c Command[Req, Reply]) Name() string { return c.name }

// String returns the command's name.
func (c Command[Req, Reply]) String() string { return c.name }

// EncodeRequest encodes a request as JSON.
func (c Command[Req, Reply]) EncodeRequest(req Req) ([]byte, error) {
	return encode(c.name, "request", req)
}

// DecodeRequest decodes a JSON request strictly: unknown fields and
// trailing data are errors wrapping ErrInvalidPayload.
func (c Command[Req, Reply]) DecodeRequest(payload []byte) (Req, error) {
	var req Req
	err := decodeStrict(payload, &req)
	if err != nil {
		return req, fmt.Errorf("%w: decode %s request: %w", ErrInvalidPayload, c.name, err)
	}
	return req, nil
}

// EncodeReply encodes a success reply as JSON.
func (c Command[Req, Reply]) EncodeReply(reply Reply) ([]byte, error) {
	return encode(c.name, "reply", reply)
}

// DecodeReply decodes a JSON success reply strictly: unknown fields and
// trailing data are errors wrapping ErrInvalidPayload.
func (c Command[Req, Reply]) DecodeReply(payload []byte) (Reply, error) {
	var reply Reply
	err := decodeStrict(payload, &reply)
	if err != nil {
		return reply, fmt.Errorf("%w: decode %s reply: %w", ErrInvalidPayload, c.name, err)
	}
	return reply, nil
}

func encode(name, what string, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %s %s: %w", name, what, err)
	}
	return b, nil
}

// decodeStrict decodes exactly one JSON value into v, refusing unknown
// fields and anything after the value but white space.
func decodeStrict(payload []byte, v any) error {
	if !utf8.Valid(payload) {
		// encoding/json would replace invalid UTF-8 in strings silently.
		return errors.New("payload is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("empty payload")
		}
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}
