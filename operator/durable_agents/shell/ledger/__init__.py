"""The ledger room.

The action ledger's ActionRecords (actions) and the dispatcher that applies, queries and reconciles
each effect exactly once (dispatcher, query_pacing, reconciling, references, unsealing).
"""
