package orchestrator

import (
	"testing"
	"time"

	"github.com/sagabox/sagabox/store/driver"
)

// TestAdmissionRoomSkipsWithinHalfTheRoom checks when a Start may trust the
// last admission count: while it is fresh, no saga was queued, and the
// Starts since it take at most half the room it left below the limit.
func TestAdmissionRoomSkipsWithinHalfTheRoom(t *testing.T) {
	t.Parallel()
	now := time.Now()
	var r admissionRooms
	if r.take("order", 100, now) {
		t.Fatal("a Start with no count on record skipped the count")
	}

	r.saw("order", driver.Admission{Running: 40}, now)
	skipped := 0
	for r.take("order", 100, now) {
		skipped++
	}
	if skipped != 30 {
		t.Fatalf("with 40 of 100 running, %d Starts skipped the count; want 30 (half of the room of 60)", skipped)
	}

	r.saw("order", driver.Admission{Running: 99}, now)
	if r.take("order", 100, now) {
		t.Fatal("with 99 of 100 running a Start skipped the count")
	}

	r.saw("order", driver.Admission{Running: 0}, now)
	if r.take("order", 100, now.Add(roomFreshness+time.Millisecond)) {
		t.Fatal("a Start trusted a count older than roomFreshness")
	}

	r.saw("order", driver.Admission{Running: 0, Queued: true}, now)
	if r.take("order", 100, now) {
		t.Fatal("a Start skipped the count while sagas were queued")
	}
}
