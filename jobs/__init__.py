"""Use cases (create, cancel, admin retry, quotas, snapshots) and the job types."""
