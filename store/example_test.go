package store_test

import (
	"fmt"
	"strings"

	"github.com/sagabox/sagabox/store"
)

// Teams that apply migrations with their own tool (goose, atlas, a DBA's
// review) can print each migration's SQL for the schema of a service. The
// same is available as `sagabox migrate print messaging 1 --schema inventory`.
func ExampleStore_MigrationSQL() {
	st, err := store.New(nil, "inventory")
	if err != nil {
		panic(err)
	}
	sql, err := st.MigrationSQL(store.LineMessaging, 1, false)
	if err != nil {
		panic(err)
	}
	for _, line := range strings.Split(sql, "\n") {
		if strings.HasPrefix(line, "CREATE TABLE") {
			fmt.Println(line)
		}
	}
	// Output:
	// CREATE TABLE "inventory".sagabox_outbox (
	// CREATE TABLE "inventory".sagabox_inbox (
	// CREATE TABLE "inventory".sagabox_inbox_attempt (
	// CREATE TABLE "inventory".sagabox_barrier (
}
