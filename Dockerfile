FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tasks tasks
COPY manager manager
COPY config config
RUN pip install --no-cache-dir .
CMD ["swapless", "worker"]
