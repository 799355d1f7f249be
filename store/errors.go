package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sagabox/sagabox/store/driver"
)

// IsRetryable reports whether err is a PostgreSQL error that running the
// whole transaction again may cure: a serialization failure (40001; also
// what a transition written against a saga that changed meanwhile fails
// with) or a deadlock (40P01). Classification is by SQLSTATE, never by
// message text; the errors of sagabox's clients carry it as
// driver.ErrConflict.
func IsRetryable(err error) bool { return errors.Is(interpretError(err), driver.ErrConflict) }

// IsConnectionError reports whether err says the database could not be
// reached or the connection was lost (a restart, a network fault), as
// opposed to an error of the statement itself. Receivers retry such errors
// without counting them against a message's attempts. Only pgx's own errors
// count (a handler's network errors do not), classified by type and
// SQLSTATE, never by message text; and the errors of statements of the
// store's transactions (a handler's transaction included) whose connection
// pgx closed under them.
func IsConnectionError(err error) bool { return errors.Is(interpretError(err), driver.ErrConnection) }

// IsDataError reports whether err is PostgreSQL refusing the data of a
// statement: a data exception (class 22, e.g. a NUL byte or invalid UTF-8 in
// text) or a program limit exceeded (class 54, e.g. a key too long for its
// index). Running the statement again with the same data fails the same way.
func IsDataError(err error) bool { return errors.Is(interpretError(err), driver.ErrDataRefused) }

// InterpretError implements driver.Executor.
func (s *executor) InterpretError(err error) error { return interpretError(err) }

// interpretError marks err with the driver's sentinel error that says what
// it calls for (driver.ErrConflict, ErrConnection, ErrDataRefused), keeping
// its message; nil and errors of other kinds pass unchanged. It is the seam
// between PostgreSQL's errors and the engine: every statement the store
// runs returns its error through it.
func interpretError(err error) error {
	if err == nil {
		return nil
	}
	for _, mark := range []error{driver.ErrConflict, driver.ErrConnection, driver.ErrDataRefused, driver.ErrPrivilege} {
		if errors.Is(err, mark) {
			return err
		}
	}
	if mark := classify(err); mark != nil {
		return &markedError{err: err, mark: mark}
	}
	return err
}

// classify returns the sentinel error err calls for, or nil: by SQLSTATE
// when PostgreSQL answered, by pgx's error types when it could not be
// reached, never by message text.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "40001", pgErr.Code == "40P01":
			return driver.ErrConflict
		// Class 08: connection exception; 57P01-57P03: admin shutdown,
		// crash shutdown, cannot connect now.
		case strings.HasPrefix(pgErr.Code, "08"), pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03":
			return driver.ErrConnection
		case strings.HasPrefix(pgErr.Code, "22"), strings.HasPrefix(pgErr.Code, "54"):
			return driver.ErrDataRefused
		case pgErr.Code == sqlstateInsufficientPrivilege:
			return driver.ErrPrivilege
		}
		return nil
	}
	// A failed connect, or a statement on a connection pgx had closed (a dead
	// pooled connection). Not pgconn.SafeToRetry: pgx also calls "safe to
	// retry" a statement on a connection still busy with an unclosed result
	// and one on a context that was already done, both failures of the
	// caller that a retry repeats for ever.
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) || errors.Is(err, pgconn.ErrConnClosed) {
		return driver.ErrConnection
	}
	return nil
}

// markedError is an error marked with a driver sentinel: errors.Is finds
// both, and its message is the error's own.
type markedError struct {
	err  error
	mark error
}

func (e *markedError) Error() string   { return e.err.Error() }
func (e *markedError) Unwrap() []error { return []error{e.err, e.mark} }

// lostConn returns err, the error of a statement on conn, marked with
// driver.ErrConnection when pgx closed conn: the statement did not fail, its
// connection did.
//
// It also marks a statement the server refused for want of a privilege
// with the role and what to do about it (ErrInsufficientPrivilege).
func lostConn(conn *pgx.Conn, err error) error {
	if conn != nil {
		err = refused(conn.Config().User, err)
	}
	if err == nil || conn == nil || !conn.IsClosed() || errors.Is(err, driver.ErrConnection) {
		return interpretError(err)
	}
	// pgx also closes a connection whose statement's context ended: that is
	// the caller's timeout or cancellation, not the database's failure.
	if pgconn.Timeout(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return &markedError{err: fmt.Errorf("database connection lost: %w", err), mark: driver.ErrConnection}
}

// ErrInsufficientPrivilege is wrapped by the errors of CheckPrivileges and
// of statements the server refused for want of a privilege (SQLSTATE 42501,
// see IsInsufficientPrivilege): the role the client connects as lacks a
// grant that sagabox's role layout gives it (docs/operations.md,
// "Security"; `sagabox roles print` prints the grants).
var ErrInsufficientPrivilege = errors.New("insufficient privilege")

// IsInsufficientPrivilege reports whether err is PostgreSQL refusing a
// statement or a connection for want of a privilege: SQLSTATE 42501
// (insufficient_privilege), e.g. a SELECT on another service's table, a
// CREATE by a runtime role, or a connection to a database the role has no
// CONNECT privilege on.
func IsInsufficientPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == sqlstateInsufficientPrivilege
}

const sqlstateInsufficientPrivilege = "42501"

// privilegeError is a statement's error of insufficient privilege with the
// role that was refused and what to do.
type privilegeError struct {
	role string
	err  error
}

func (e *privilegeError) Error() string {
	return fmt.Sprintf("%v: role %q lacks a privilege on the object named there; grant it what its part needs "+
		"(print a service's grants with `sagabox roles print --schema SCHEMA --role %s`, see docs/operations.md, \"Security\"; "+
		"a client lists the exact GRANTs it misses when it starts)", e.err, e.role, e.role)
}

func (e *privilegeError) Unwrap() []error { return []error{e.err, ErrInsufficientPrivilege} }

// refused returns err marked with ErrInsufficientPrivilege and a hint that
// names role when the server refused it for want of a privilege.
func refused(role string, err error) error {
	if err == nil || !IsInsufficientPrivilege(err) || errors.Is(err, ErrInsufficientPrivilege) {
		return err
	}
	return &privilegeError{role: role, err: err}
}

// isUndefined reports whether err says a table or schema does not exist
// (42P01, 3F000), which for sagabox means migrations have not been applied.
func isUndefined(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000" || pgErr.Code == "42883")
}

// maxStoredText is the most bytes of an error or reason text recorded in a
// row; a longer one is cut (see storableText).
const maxStoredText = 8 << 10

// storableText returns s as Postgres text can hold it, and as a row should:
// valid UTF-8 without NUL bytes, cut after maxStoredText bytes with a note
// of its length. Error texts come from handlers and from the messages they
// handle, and a failure that cannot be recorded could never be counted.
func storableText(s string) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\\x00")
	if len(s) <= maxStoredText {
		return s
	}
	cut := maxStoredText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (cut from %d bytes)", s[:cut], len(s))
}

// ConnectProblem is why connecting to PostgreSQL failed, as far as tools
// need to tell a person what to do (ClassifyConnect).
type ConnectProblem int

// The connect problems ClassifyConnect tells apart.
const (
	// ConnectOther is any other failure (or none).
	ConnectOther ConnectProblem = iota
	// ConnectUnreachable: no server answered (down, wrong host or port, a
	// network fault).
	ConnectUnreachable
	// ConnectAuthFailed: the server refused the password (28P01).
	ConnectAuthFailed
	// ConnectRoleRejected: the role does not exist or pg_hba.conf refuses
	// it (28000; PostgreSQL reports both with one SQLSTATE).
	ConnectRoleRejected
	// ConnectNoDatabase: the database does not exist (3D000).
	ConnectNoDatabase
	// ConnectCertificate: TLS: the server's certificate did not verify
	// (an unknown CA, another host name, expired); ExplainCertificate says
	// which server, which CA and what to do.
	ConnectCertificate
	// ConnectPermissionDenied: the role may not connect to the database
	// (42501: no CONNECT privilege on it).
	ConnectPermissionDenied
)

// ClassifyConnect says why err, an error of connecting or pinging, failed:
// by SQLSTATE when the server answered, by the x509 error types when TLS
// did not verify the server, and by pgx's connect error type when none
// answered; never by message text.
func ClassifyConnect(err error) ConnectProblem {
	if err == nil {
		return ConnectOther
	}
	if isCertificateError(err) {
		return ConnectCertificate
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "28P01":
			return ConnectAuthFailed
		case "28000":
			return ConnectRoleRejected
		case "3D000":
			return ConnectNoDatabase
		case sqlstateInsufficientPrivilege:
			return ConnectPermissionDenied
		}
		if IsConnectionError(err) {
			return ConnectUnreachable
		}
		return ConnectOther
	}
	if IsConnectionError(err) {
		return ConnectUnreachable
	}
	return ConnectOther
}
