"""The ledger room.

The action ledger's ActionRecords (actions) and the dispatcher that applies, queries and reconciles
each effect exactly once (dispatcher; what it writes of a record: record_writes; whether a record
is its run's intent: intent_checks; query_pacing, reconciling, references, unsealing).
"""
