package store_test

import (
	"fmt"
	"strings"

	"github.com/sagabox/sagabox/store"
)

// The grants of a service's runtime role, as `sagabox roles print --schema
// inventory --role inventory_app` prints them, to run as the schema's owner
// after the migrations.
func ExampleGrantsSQL() {
	sql, err := store.GrantsSQL(store.GrantOpts{Schema: "inventory", Role: "inventory_app"})
	if err != nil {
		panic(err)
	}
	for _, line := range strings.Split(sql, "\n") {
		if strings.HasPrefix(line, "GRANT") || strings.HasPrefix(line, "REVOKE") {
			fmt.Println(line)
		}
	}
	// Output:
	// GRANT USAGE ON SCHEMA "inventory" TO "inventory_app";
	// GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "inventory" TO "inventory_app";
	// REVOKE INSERT, UPDATE, DELETE ON "inventory"."sagabox_migration" FROM "inventory_app";
	// GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA "inventory" TO "inventory_app";
	// GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA "inventory" TO "inventory_app";
}

// A connection string fit to show: the password goes, the rest stays.
func ExampleRedactConnString() {
	fmt.Println(store.RedactConnString("postgres://app:s3cret@db.internal:5432/shop?sslmode=verify-full"))
	fmt.Println(store.RedactConnString("host=db.internal user=app password='s3 cret' dbname=shop"))
	// Output:
	// postgres://app:***@db.internal:5432/shop?sslmode=verify-full
	// host=db.internal user=app password=*** dbname=shop
}
