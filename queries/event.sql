-- Outside events sent to sagas (orchestrator.SendEvent).

-- name: EventRecord :execrows
-- Records an outside event for a saga; a second event with the same id for
-- the saga records nothing (0 rows).
INSERT INTO /* TEMPLATE: schema */sagabox_saga_event (saga_id, event_id, name, payload, received_at)
VALUES (@saga_id::uuid, @event_id::text, @name::text, @payload::jsonb, @received_at::timestamptz)
ON CONFLICT (saga_id, event_id) DO NOTHING;

-- name: EventPending :many
-- Returns the oldest pending event called @name of saga @saga_id (none or one).
SELECT event_id, name, payload, received_at FROM /* TEMPLATE: schema */sagabox_saga_event
WHERE saga_id = @saga_id::uuid AND name = @name::text AND status = 'pending'
ORDER BY received_at, event_id
LIMIT 1;

-- name: EventSettle :exec
-- Marks an event consumed or ignored.
UPDATE /* TEMPLATE: schema */sagabox_saga_event
SET status = @status::text, detail = @detail::text, settled_at = @settled_at::timestamptz
WHERE saga_id = @saga_id::uuid AND event_id = @event_id::text;
