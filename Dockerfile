# bucketsearch HTTP service: `bucketsearch serve` on port 8000, data in the /data volume, the
# numba kernel cache in the /var/cache/numba volume.
# Build: docker build -t bucketsearch .
# Run:   docker run -p 8000:8000 -v bs-data:/data -v bs-numba:/var/cache/numba bucketsearch

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY bucketsearch ./bucketsearch
COPY index ./index
COPY app ./app
COPY loadtest ./loadtest
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir .

FROM python:3.11-slim
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NUMBA_CACHE_DIR=/var/cache/numba \
    BUCKETSEARCH_DATA_DIR=/data
RUN groupadd --system --gid 10001 bucketsearch \
    && useradd --system --uid 10001 --gid bucketsearch --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin bucketsearch \
    && mkdir -p /data /var/cache/numba \
    && chown bucketsearch:bucketsearch /data /var/cache/numba
COPY --from=build /opt/venv /opt/venv
USER 10001:10001
# Compile every kernel a request can reach (in-memory and memory-mapped snapshots) into the
# numba cache now, as the runtime user, so that a container is ready without compiling. Numba
# keys its cache by CPU: on a host whose CPU differs from the build machine's, the first start
# compiles once more (about 75 s on 2 cores) into the cache volume, which keeps it for the next
# container. The RUN must come before the VOLUME below (later changes to a volume are dropped).
RUN python -m bucketsearch.app.startup --warm --mmap
WORKDIR /data
VOLUME ["/data", "/var/cache/numba"]
EXPOSE 8000
# /readyz turns 200 once every index is loaded and the numba kernels are compiled (warm-up)
HEALTHCHECK --interval=15s --timeout=3s --start-period=180s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2).status == 200 else 1)"]
CMD ["bucketsearch", "serve", "--data-dir", "/data", "--host", "0.0.0.0", "--port", "8000"]
