"""The wire: typed messages (`protocol`, plain data, no torch), the zmq transport (`transport`; the servers'
socket and loop: `serving`), the draft server (`draft_server`, `server_core`: one row over any draft engine, or
many sequences batched), its one client (`draft_client`: under the sync loop's, the pipelined loop's and the
target worker's handles, `draft_handles`, and vLLM's proposer, `vllm_proposer`), and the target worker
(`target_worker`)."""
