# One image for every ai-job-engine process (api, workers, migrate); docker-compose picks the command.
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY pyproject.toml README.md ./
COPY engine engine
COPY db db
COPY providers providers
COPY jobs jobs
COPY workflows workflows
COPY activities activities
COPY api api
COPY runtime runtime
RUN pip install --no-cache-dir .
USER nobody
ENTRYPOINT ["aijobs"]
