package transport_test

import (
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/sagabox/sagabox/message"
	"github.com/sagabox/sagabox/transport"
)

// Validate names every field a receiver would miss.
func ExampleEnvelope_Validate() {
	env := message.Envelope{Version: 1, MessageID: uuid.New(), Type: "inventory.reserve", Kind: message.KindCommand}
	fmt.Println(env.Validate())
	// Output:
	// saga_id is missing on a command
	// step is missing on a command
}

// A relay marks published exactly the messages the broker confirmed.
func ExampleConfirmed() {
	err := &transport.PublishError{Failed: map[int]error{1: errors.New("NO_ROUTE")}}
	fmt.Println(transport.Confirmed(3, err))
	fmt.Println(transport.Confirmed(3, nil))
	fmt.Println(transport.Confirmed(3, errors.New("connection closed")))
	// Output:
	// [true false true]
	// [true true true]
	// [false false false]
}
