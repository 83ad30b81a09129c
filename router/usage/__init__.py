"""Who used how much: the usage ledger (SQLite, by key, model and hour), the quotas a key's
table sets, and the routes that show them (issue 44)."""
