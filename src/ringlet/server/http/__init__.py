"""HTTP plumbing every route shares: API keys and scopes (`auth`), per-key limits (`limits`), the error shape
and request ids (`errors`), `Idempotency-Key` (`idempotency`), the request and response models of the API
document (`schemas`), the server's settings (`settings`) and the SSE response itself (`sse`). It knows
nothing of runs or protocols."""
