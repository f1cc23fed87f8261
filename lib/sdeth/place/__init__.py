"""Where things run: the two-node testbed (`testbed`: namespaces, veth, link shaping), the link probe
(`netprobe`) and Kubernetes control (`cluster`). Imports neither torch nor the runtime: workers are
started as processes (`python -m sdeth worker ...`)."""
