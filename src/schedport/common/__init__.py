"""Shared plumbing every layer may use: safe output paths and atomic writes, and the guards
that keep one command from overwriting another's work. Knows nothing of traces or engines."""
