"""The wire: typed messages (`protocol`, plain data, no torch), the zmq transport (`transport`; the servers'
socket and loop: `serving`), the draft and target workers (`draft_worker`, `target_worker`) and the target's
handles on a remote draft (`remote`)."""
