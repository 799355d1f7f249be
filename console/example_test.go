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

// A console that knows who is acting, on its own port behind oauth2-proxy
// (at 10.0.0.4), which names the user in X-Forwarded-Email and their groups
// in X-Forwarded-Groups: members of sre may act, everyone else the proxy
// lets in reads. Users of an htpasswd file (lines user:bcrypt-hash:role) may
// also sign in with basic auth, e.g. when the identity provider is down.
// Each action is recorded under the signed-in user.
func ExampleNew_authentication() {
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:5432/shop")
	if err != nil {
		log.Fatal(err)
	}
	h, err := console.New(console.Config{
		Pool:         pool,
		Schema:       "orders",
		AllowActions: true,
		Auth: console.AuthConfig{
			ProxyHeader:       "X-Forwarded-Email",
			ProxyGroupsHeader: "X-Forwarded-Groups",
			TrustedProxies:    []string{"10.0.0.4"},
			GroupRoles:        map[string]console.Role{"sre": console.RoleOperator},
			HtpasswdFile:      "/etc/sagabox/console.htpasswd",
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = http.ListenAndServe("10.0.0.5:8080", h)
}
