"""The shell: everything that talks to the API server. Depends on the core, never the reverse."""
