"""The wire: typed messages (`protocol`, plain data, no torch), the zmq transport (`transport`), the
draft and target workers (`draft_worker`, `target_worker`) and the target's handles on a remote draft
(`remote`)."""
