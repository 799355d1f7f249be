package console_test

import (
	"context"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sagabox/sagabox/console"
)

// A service mounts the console under /console, behind its own
// authentication, with actions recorded as the authenticated user.
func ExampleNew() {
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:5432/shop")
	if err != nil {
		log.Fatal(err)
	}
	h, err := console.New(console.Config{
		Pool:             pool,
		Schema:           "orders",
		MessagingSchemas: []string{"inventory", "payment"},
		BasePath:         "/console",
		AllowActions:     true,
		Actor: func(r *http.Request) string {
			user, _, _ := r.BasicAuth() // the service's authentication
			return user
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", h)
	_ = http.ListenAndServe("127.0.0.1:8080", mux)
}
