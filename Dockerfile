# actonce: one image for every service of docker-compose.yml (migrate, dispatcher, worker, flower).
# Everything is installed at build time; at run time the containers reach only their services
# (Redis, PostgreSQL), never a package index.
FROM python:3.12-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Only what the package is built from: no virtualenv, caches or local .env in the image.
COPY pyproject.toml README.md ./
COPY actonce ./actonce
COPY worker ./worker
COPY tasks ./tasks
COPY demo ./demo
RUN pip install . \
    && useradd --create-home --uid 10001 actonce \
    && mkdir -p /app/var \
    && chown actonce:actonce /app/var

# Celery refuses nothing as root but warns; the pool has no reason to be root.
USER actonce

CMD ["actonce", "--help"]
