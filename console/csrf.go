package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
)

// csrfCookie holds a browser's random CSRF nonce; csrfField is the form
// field with its token.
const (
	csrfCookie = "sagabox_console_csrf"
	csrfField  = "csrf"
)

// csrf issues and checks the tokens of the console's forms: a random nonce
// in a SameSite=Strict, HttpOnly cookie, and in each form the HMAC of that
// nonce under the process's secret. Another site can neither read the
// cookie nor compute the token, and a browser does not send the cookie with
// a request another site starts.
type csrf struct {
	secret []byte
	path   string
}

// token returns the form token of the request's browser, setting its nonce
// cookie when it has none: HttpOnly, SameSite=Strict, and Secure when
// secure (the page was served over TLS, or to a trusted proxy that was
// reached over HTTPS).
func (c *csrf) token(w http.ResponseWriter, r *http.Request, secure bool) (string, error) {
	nonce := ""
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) == 32 {
		nonce = ck.Value
	} else {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		nonce = hex.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{
			Name: csrfCookie, Value: nonce, Path: c.path, HttpOnly: true, SameSite: http.SameSiteStrictMode,
			Secure: secure,
		})
	}
	return c.sign(nonce), nil
}

func (c *csrf) sign(nonce string) string {
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte(nonce))
	return hex.EncodeToString(m.Sum(nil))
}

// check verifies the token of a POST against its cookie.
func (c *csrf) check(r *http.Request) error {
	ck, err := r.Cookie(csrfCookie)
	if err != nil || ck.Value == "" {
		return errors.New("CSRF cookie missing: reload the page and submit the form again")
	}
	got, err := hex.DecodeString(r.PostFormValue(csrfField))
	if err != nil || len(got) == 0 {
		return errors.New("CSRF token missing: reload the page and submit the form again")
	}
	want, _ := hex.DecodeString(c.sign(ck.Value))
	if !hmac.Equal(got, want) {
		return errors.New("CSRF token invalid: reload the page and submit the form again")
	}
	return nil
}
