-- Temporal's auto-setup image creates its own databases; it needs a role that may do so.
CREATE ROLE temporal WITH LOGIN PASSWORD 'temporal' CREATEDB;
