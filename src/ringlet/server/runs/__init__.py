"""The run machinery: the `Runner` facade routes call (`runner`) over its parts, which reach one another
through it (`host`): starting and cancelling runs (`starter`), the one driver of every run (`driver`),
people's decisions and answers (`pauses`), and dead processes' runs (`recovery`). Beside them: the
per-conversation hub of published events (`active`), what a client follows (`follow`), what each kind of run
stores (`tracks`, `graphs`). Durable execution on DBOS is a room of its own (`ringlet.server.durable`)."""
