"""The decoding runtime: one engine over one model interface (`engine`, `fastmodel`), lossless
acceptance (`verify`), the sync and pipelined loops (`loop`, `pipeline`), the roles a draft plays in
them (`roles`), and synthetic acceptance for random-weight timing (`synthetic`). Knows nothing of
wires, clusters or notebooks."""
