FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY src src
COPY tasks tasks
COPY manager manager
COPY config config
RUN pip install --no-cache-dir .
CMD ["swapless", "worker"]
