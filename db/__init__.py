"""PostgreSQL: models, sessions, repositories and migrations. The source of truth for lifecycle."""
