"""FastAPI app: routes, auth, problem+json errors, response models (docs/api.md)."""
