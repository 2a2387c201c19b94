"""Shared SQL: the statements both stores run, SQLite and PostgreSQL alike, with `?`
parameters (PgConnection turns them into psycopg's), and the Python around them; each
engine's folder (sqlite/, postgres/) subclasses these parts with only what is its own.
"""
