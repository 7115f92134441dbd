# bucketsearch HTTP service: `bucketsearch serve` on port 8000, data in the /data volume.
# Build: docker build -t bucketsearch .    Run: docker run -p 8000:8000 -v bs-data:/data bucketsearch

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
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
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8000
# /readyz turns 200 once every index is loaded and the numba kernels are compiled (warm-up)
HEALTHCHECK --interval=15s --timeout=3s --start-period=180s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2).status == 200 else 1)"]
CMD ["bucketsearch", "serve", "--data-dir", "/data", "--host", "0.0.0.0", "--port", "8000"]
