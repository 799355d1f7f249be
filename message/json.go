package message

import (
	"encoding/json"
	"errors"
	"unicode/utf8"
)

// validJSON reports whether payload is one JSON document in valid UTF-8.
// encoding/json accepts invalid UTF-8 inside strings (it substitutes
// U+FFFD), so that is checked too.
func validJSON(payload []byte) error {
	if !utf8.Valid(payload) {
		return errors.New("payload is not valid UTF-8")
	}
	if !json.Valid(payload) {
		return errors.New("payload is not valid JSON")
	}
	return nil
}
