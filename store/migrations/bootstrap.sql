-- Bookkeeping for sagabox migrations. The migrator creates it (idempotently,
-- under its advisory lock) before it applies or reverts any migration.
CREATE TABLE IF NOT EXISTS /* TEMPLATE: schema */sagabox_migration (
    line        text        NOT NULL,
    version     integer     NOT NULL,
    name        text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (line, version)
);
