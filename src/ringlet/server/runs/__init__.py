"""The run machinery: one driver for every kind of run (`driver`), behind the `Runner` facade routes call
(`runner`), with the per-conversation hub of published events (`active`), what a client follows (`follow`),
human pauses (`pauses`), recovery of dead processes' runs (`recovery`, `reconcile`), what each kind of run
stores (`tracks`, `graphs`, `children`), and, on PostgreSQL, durable execution on DBOS (`engine`, `dbos`,
`feed`: other processes' events)."""
