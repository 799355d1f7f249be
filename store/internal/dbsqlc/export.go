package dbsqlc

// OutboxClaimSQL is the claim statement, exported for EXPLAIN in tests.
const OutboxClaimSQL = outboxClaim
