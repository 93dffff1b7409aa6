# vaultvec image for KubeRay: the official Ray image of the pinned Ray version with vaultvec
# (and its PostgreSQL store driver) installed into the image's Python.
#
#   docker build -t vaultvec:0.1.0 .
#   docker build --build-arg EMBEDDINGS=true -t vaultvec:0.1.0-embeddings .   # text search
#
# Keep the Ray version of the tag, the ray pin below and spec.rayClusterConfig.rayVersion in
# k8s/base/rayservice.yaml equal (tests/unit/test_k8s.py checks them against the installed ray).
FROM rayproject/ray:2.60.0-py311-cpu

# true: add the embeddings extra (sentence-transformers, the built-in model) with the CPU build
# of torch, pinned in the same pip command.
ARG EMBEDDINGS=false
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

# Only what the package needs to build; tests, benchmarks and data stay out (.dockerignore too).
# The build directory belongs to the image's user (ray), who owns the Python environment.
RUN mkdir /tmp/vaultvec
WORKDIR /tmp/vaultvec
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users actors ./actors
COPY --chown=ray:users cluster ./cluster
COPY --chown=ray:users serve_app ./serve_app

RUN if [ "$EMBEDDINGS" = "true" ]; then \
        pip install --no-cache-dir --extra-index-url "$TORCH_INDEX_URL" \
            "ray[serve]==2.60.0" "torch==2.13.0" ".[postgres,embeddings]"; \
    else \
        pip install --no-cache-dir "ray[serve]==2.60.0" ".[postgres]"; \
    fi \
    && cd / && rm -rf /tmp/vaultvec \
    && python -c "import serve_app.app, psycopg" \
    && [ "$(command -v vaultvec-haproxy)" = /home/ray/anaconda3/bin/vaultvec-haproxy ]

# k8s/ runs HAProxy through vaultvec's guard at that path (RAY_SERVE_HAPROXY_BINARY_PATH).
WORKDIR /home/ray
