package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sagabox/sagabox/store/driver"
	"github.com/sagabox/sagabox/store/internal/dbsqlc"
)

// Log mode: the relay reads the outbox's inserts from the write-ahead log
// through a logical replication slot with the pgoutput plugin, over a
// replication connection (pglogrepl), instead of claiming rows. The queries
// are in queries/outboxlog.sql; the publication's DDL names the publication
// and the schema's table, like the migrations' DDL.

// SQLSTATEs of the replication commands.
const (
	sqlstateObjectInUse     = "55006" // the slot is active for another PID
	sqlstateDuplicateObject = "42710" // the slot exists
	sqlstateUndefinedObject = "42704" // the slot does not exist
)

// isCode reports whether err is a PostgreSQL error with SQLSTATE code.
func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// walLevelAdvice says exactly what to change when wal_level is not logical.
func walLevelAdvice(level string) error {
	return fmt.Errorf("relay log mode needs wal_level = logical, but the server has wal_level = %s: "+
		"run ALTER SYSTEM SET wal_level = logical (or set wal_level = logical in postgresql.conf), "+
		"check that max_replication_slots and max_wal_senders are at least 1 each (their defaults are 10), "+
		"and restart PostgreSQL; or keep the polling relay (Relay.Mode = orchestrator.RelayModePoll, participant.RelayModePoll)", level)
}

// OutboxLogAwaitVisible implements driver.Executor: it asks a new
// snapshot whether any of xids is still in progress, at once and then
// after a short, doubling pause (1 ms to 50 ms), until none is.
func (s *executor) OutboxLogAwaitVisible(ctx context.Context, xids []uint32) error {
	if len(xids) == 0 {
		return nil
	}
	db, err := s.pooled()
	if err != nil {
		return err
	}
	ids := make([]int64, len(xids))
	for i, x := range xids {
		ids[i] = int64(x)
	}
	pause := time.Millisecond
	for {
		n, err := s.queries.OutboxLogInProgress(ctx, db, ids)
		if err != nil {
			return fmt.Errorf("check that %d streamed transactions are visible in schema %q: %w", len(xids), s.schema, err)
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// OutboxLogStatus implements driver.Executor.
func (s *executor) OutboxLogStatus(ctx context.Context, slot, publication string) (driver.LogStatus, error) {
	if s.pool == nil {
		return driver.LogStatus{}, fmt.Errorf("store for schema %q has no connection pool", s.schema)
	}
	row, err := s.queries.OutboxLogStatus(ctx, s.db(s.pool), &dbsqlc.OutboxLogStatusParams{Publication: publication, Slot: slot})
	if err != nil {
		return driver.LogStatus{}, fmt.Errorf("read replication slot %q: %w", slot, err)
	}
	st := driver.LogStatus{
		WALLevel: row.WalLevel, PublicationExists: row.PublicationExists, SlotExists: row.SlotExists,
		Active: row.Active, ActivePID: int(row.ActivePid), LagBytes: row.LagBytes,
	}
	l, err := pglogrepl.ParseLSN(row.ConfirmedLsn)
	if err != nil {
		return driver.LogStatus{}, fmt.Errorf("read replication slot %q: %w", slot, err)
	}
	st.ConfirmedLSN = uint64(l)
	return st, nil
}

// OutboxLogSetup implements driver.Executor. The publication comes first,
// then the slot: a slot streams from where it is created, so whatever is
// committed after this returns is read by the relay.
func (s *executor) OutboxLogSetup(ctx context.Context, slot, publication string) (bool, error) {
	st, err := s.OutboxLogStatus(ctx, slot, publication)
	if err != nil {
		return false, err
	}
	if st.WALLevel != "logical" {
		return false, walLevelAdvice(st.WALLevel)
	}
	if !st.PublicationExists {
		// Inserts only: the relay's own deletes and marks are not streamed.
		_, err := s.pool.Exec(ctx, "CREATE PUBLICATION "+pgx.Identifier{publication}.Sanitize()+
			" FOR TABLE "+s.prefix+"sagabox_outbox WITH (publish = 'insert')")
		if err != nil && !isCode(err, sqlstateDuplicateObject) {
			return false, fmt.Errorf("create publication %q: %w", publication, interpretError(err))
		}
	}
	if st.SlotExists {
		return false, nil
	}
	err = s.queries.OutboxLogCreateSlot(ctx, s.db(s.pool), slot)
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) && pgErr.Code == sqlstateDuplicateObject {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("create replication slot %q: %w", slot, err)
	}
	// The slot streams what commits from now on: the rows already written
	// are owed from the table (OutboxLogOwed). Recorded after the slot
	// exists, so that every row committed before it is counted; without the
	// record, the slot goes again, for the next set-up to make both.
	if err := s.queries.OutboxLogSlotCreated(ctx, s.db(s.pool), slot); err != nil {
		if derr := s.queries.OutboxLogDropSlot(context.WithoutCancel(ctx), s.db(s.pool), slot); derr != nil {
			return false, fmt.Errorf("record replication slot %q: %w (and dropping it failed: %w: drop it with `sagabox relay drop-log` before the next set-up)", slot, err, derr)
		}
		return false, fmt.Errorf("record replication slot %q: %w", slot, err)
	}
	return true, nil
}

// OutboxLogOwed implements driver.Executor.
func (s *executor) OutboxLogOwed(ctx context.Context, slot string) (int64, error) {
	db, err := s.pooled()
	if err != nil {
		return 0, err
	}
	n, err := s.queries.OutboxLogOwed(ctx, db, slot)
	if err != nil {
		return 0, fmt.Errorf("count the rows replication slot %q does not stream in schema %q: %w", slot, s.schema, err)
	}
	return n, nil
}

// outboxLogDrop drops the slot (refused while a reader holds it) and the
// publication, those that exist. It waits up to 5 s for a reader that is
// going away.
func (s *executor) outboxLogDrop(ctx context.Context, slot, publication string) error {
	st, err := s.OutboxLogStatus(ctx, slot, publication)
	if err != nil {
		return err
	}
	// A relay that has just stopped leaves its server process behind for
	// a moment: wait a few seconds for the slot to be released.
	for wait := 0; st.SlotExists && st.Active && wait < 50; wait++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if st, err = s.OutboxLogStatus(ctx, slot, publication); err != nil {
			return err
		}
	}
	if st.SlotExists {
		if st.Active {
			return fmt.Errorf("drop replication slot %q: a relay (backend PID %d) is reading it: stop the relays in log mode first", slot, st.ActivePID)
		}
		err := s.queries.OutboxLogDropSlot(ctx, s.db(s.pool), slot)
		if err != nil && !isCode(err, sqlstateUndefinedObject) {
			return fmt.Errorf("drop replication slot %q: %w", slot, err)
		}
	}
	if _, err := s.db(s.pool).Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{publication}.Sanitize()); err != nil {
		return fmt.Errorf("drop publication %q: %w", publication, err)
	}
	return nil
}

// OutboxLogOpen implements driver.Executor.
func (s *executor) OutboxLogOpen(ctx context.Context, slot, publication string) (driver.OutboxLog, error) {
	st, err := s.OutboxLogStatus(ctx, slot, publication)
	if err != nil {
		return nil, err
	}
	switch {
	case st.WALLevel != "logical":
		return nil, walLevelAdvice(st.WALLevel)
	case !st.PublicationExists:
		return nil, fmt.Errorf("relay log mode: the publication %q of schema %q does not exist: run `sagabox relay setup-log --schema %s` first", publication, s.schema, s.schema)
	case !st.SlotExists:
		return nil, fmt.Errorf("relay log mode: the replication slot %q of schema %q: %w", slot, s.schema, driver.ErrLogSlotMissing)
	case st.Active:
		return nil, fmt.Errorf("open replication slot %q: %w (backend PID %d)", slot, driver.ErrLogSlotBusy, st.ActivePID)
	}
	cfg := s.pool.Config().ConnConfig.Config.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "sagabox-relay"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open replication connection: %w", err)
	}
	err = pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			"publication_names " + quoteLiteral(publication),
			"binary 'true'",
		},
	})
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == sqlstateObjectInUse {
			return nil, fmt.Errorf("start replication from slot %q: %w: %w", slot, driver.ErrLogSlotBusy, err)
		}
		return nil, fmt.Errorf("start replication from slot %q: %w", slot, err)
	}
	return &outboxLog{
		conn: conn, schema: s.schema, slot: slot, types: pgtype.NewMap(),
		rels: map[uint32]*pglogrepl.RelationMessage{}, confirmed: pglogrepl.LSN(st.ConfirmedLSN), lastStatus: time.Now(),
	}, nil
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := range len(s) {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}

// outboxLog implements driver.OutboxLog on a replication connection.
type outboxLog struct {
	conn         *pgconn.PgConn
	schema, slot string
	types        *pgtype.Map
	rels         map[uint32]*pglogrepl.RelationMessage
	// inTx: a transaction's BEGIN was read and not its COMMIT; xid is
	// its id.
	inTx       bool
	xid        uint32
	confirmed  pglogrepl.LSN
	lastStatus time.Time
}

// Timings of the reader.
const (
	// logStatusInterval is how often the reader reports its position when
	// nothing else makes it (well within wal_sender_timeout, 60 s).
	logStatusInterval = 10 * time.Second
	// logLinger is how long a batch that has rows waits for more.
	logLinger = 500 * time.Microsecond
)

// Next implements driver.OutboxLog.
func (l *outboxLog) Next(ctx context.Context, max int, idle time.Duration) (driver.LogBatch, error) {
	var b driver.LogBatch
	for {
		if time.Since(l.lastStatus) >= logStatusInterval {
			if err := l.Confirm(ctx, 0); err != nil {
				return b, err
			}
		}
		wait := logStatusInterval
		if idle > 0 {
			wait = idle
		}
		if len(b.Rows) > 0 || b.Through > 0 {
			wait = logLinger
		}
		rctx, cancel := context.WithTimeout(ctx, wait)
		msg, err := l.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return b, ctx.Err()
			}
			if pgconn.Timeout(err) {
				if len(b.Rows) > 0 || b.Through > 0 || idle > 0 {
					return b, nil
				}
				continue
			}
			return b, fmt.Errorf("read replication slot %q: %w", l.slot, err)
		}
		switch msg := msg.(type) {
		case *pgproto3.ErrorResponse:
			return b, fmt.Errorf("read replication slot %q: %w", l.slot, pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return b, fmt.Errorf("read replication slot %q: %w", l.slot, err)
				}
				if ka.ReplyRequested {
					if err := l.Confirm(ctx, 0); err != nil {
						return b, err
					}
				}
				// Idle: everything the server has read up to its position
				// was sent, and no transaction is open, so the position may
				// be confirmed once this batch is published (a slot with
				// no outbox writes does not hold the log of other tables).
				if !l.inTx && uint64(ka.ServerWALEnd) > max64(b.Through, uint64(l.confirmed)) {
					b.Through = uint64(ka.ServerWALEnd)
					return b, nil
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return b, fmt.Errorf("read replication slot %q: %w", l.slot, err)
				}
				full, err := l.decode(xld.WALData, &b)
				if err != nil {
					return b, err
				}
				if full || len(b.Rows) >= max {
					return b, nil
				}
			}
		}
	}
}

func max64(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}

// decode applies one pgoutput message to b; it reports whether a
// transaction ended with b full.
func (l *outboxLog) decode(data []byte, b *driver.LogBatch) (bool, error) {
	m, err := pglogrepl.Parse(data)
	if err != nil {
		return false, fmt.Errorf("decode replication message from slot %q: %w", l.slot, err)
	}
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		l.rels[m.RelationID] = m
	case *pglogrepl.BeginMessage:
		l.inTx, l.xid = true, m.Xid
	case *pglogrepl.CommitMessage:
		l.inTx = false
		b.Through = uint64(m.TransactionEndLSN)
	case *pglogrepl.InsertMessage:
		rel, ok := l.rels[m.RelationID]
		if !ok {
			return false, fmt.Errorf("decode insert from slot %q: relation %d was not described", l.slot, m.RelationID)
		}
		if rel.Namespace != l.schema || rel.RelationName != "sagabox_outbox" {
			return false, nil // another table in the publication
		}
		row, err := l.row(rel, m.Tuple)
		if err != nil {
			return false, err
		}
		b.Rows = append(b.Rows, row)
		if n := len(b.Xids); n == 0 || b.Xids[n-1] != l.xid {
			b.Xids = append(b.Xids, l.xid)
		}
	}
	return false, nil
}

// row decodes an inserted outbox row (binary pgoutput values).
func (l *outboxLog) row(rel *pglogrepl.RelationMessage, t *pglogrepl.TupleData) (driver.OutboxRow, error) {
	var r dbsqlc.SagaboxOutbox
	for i, col := range t.Columns {
		if i >= len(rel.Columns) {
			break
		}
		rc := rel.Columns[i]
		if col.DataType == pglogrepl.TupleDataTypeNull || col.DataType == pglogrepl.TupleDataTypeToast {
			continue
		}
		var dst any
		switch rc.Name {
		case "id":
			dst = &r.ID
		case "message_id":
			var u pgtype.UUID
			if err := l.scan(rc, col, &u); err != nil {
				return driver.OutboxRow{}, err
			}
			r.MessageID = u.Bytes
			continue
		case "ordering_key":
			dst = &r.OrderingKey
		case "kind":
			dst = &r.Kind
		case "type":
			dst = &r.Type
		case "routing_key":
			dst = &r.RoutingKey
		case "saga_id":
			var u pgtype.UUID
			if err := l.scan(rc, col, &u); err != nil {
				return driver.OutboxRow{}, err
			}
			r.SagaID = uuid.NullUUID{UUID: u.Bytes, Valid: u.Valid}
			continue
		case "saga_type":
			dst = &r.SagaType
		case "step":
			dst = &r.Step
		case "step_index":
			dst = &r.StepIndex
		case "attempt":
			dst = &r.Attempt
		case "reply_to":
			dst = &r.ReplyTo
		case "correlation_id":
			dst = &r.CorrelationID
		case "traceparent":
			dst = &r.Traceparent
		case "tracestate":
			dst = &r.Tracestate
		case "headers":
			dst = &r.Headers
		case "payload":
			dst = &r.Payload
		case "created_at":
			dst = &r.CreatedAt
		default:
			continue
		}
		if err := l.scan(rc, col, dst); err != nil {
			return driver.OutboxRow{}, err
		}
	}
	return driver.OutboxRow{ID: r.ID, Message: outboxMessage(&r)}, nil
}

func (l *outboxLog) scan(rc *pglogrepl.RelationMessageColumn, col *pglogrepl.TupleDataColumn, dst any) error {
	format := int16(pgtype.BinaryFormatCode)
	if col.DataType == pglogrepl.TupleDataTypeText {
		format = pgtype.TextFormatCode
	}
	if err := l.types.Scan(rc.DataType, format, col.Data, dst); err != nil {
		return fmt.Errorf("decode column %s of an outbox insert from slot %q: %w", rc.Name, l.slot, err)
	}
	return nil
}

// Confirm implements driver.OutboxLog.
func (l *outboxLog) Confirm(ctx context.Context, lsn uint64) error {
	if pglogrepl.LSN(lsn) > l.confirmed {
		l.confirmed = pglogrepl.LSN(lsn)
	}
	err := pglogrepl.SendStandbyStatusUpdate(ctx, l.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: l.confirmed})
	if err != nil {
		return fmt.Errorf("confirm position %s of replication slot %q: %w", l.confirmed, l.slot, err)
	}
	l.lastStatus = time.Now()
	return nil
}

// Close implements driver.OutboxLog.
func (l *outboxLog) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return l.conn.Close(ctx)
}
