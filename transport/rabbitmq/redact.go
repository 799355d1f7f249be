package rabbitmq

import (
	"net/url"
)

// RedactURL returns rawURL, an AMQP URL, fit to show in a log line or an
// error: its password replaced by "***". A URL that cannot be parsed keeps
// only what follows its last '@'.
func RedactURL(rawURL string) string { return redactURL(rawURL) }

// RedactError returns err, an error of dialling or using rawURL, with the
// URL's password removed from its text; the result wraps err. When rawURL
// cannot be parsed, so that its password cannot be told apart, the text is
// not shown at all.
func RedactError(rawURL string, err error) error {
	if err == nil {
		return nil
	}
	if _, perr := url.Parse(rawURL); perr != nil {
		return &redactedError{msg: "rabbitmq: " + redactURL(rawURL) + " is not a valid URL (the error is not shown: it may quote the URL's password)", err: err}
	}
	return redactErr(rawURL, err)
}
