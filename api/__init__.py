"""FastAPI app: routes, auth, problem+json errors, response models (DESIGN §9)."""
