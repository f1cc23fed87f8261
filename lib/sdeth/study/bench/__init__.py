"""The benchmarks (`python -m sdeth bench ...`): decoding modes, the decode step lever by lever, bigger targets, the
link's encryption, the pipelined draft's loop, many clients through one draft server on the CPU."""
