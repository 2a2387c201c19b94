"""Where the engine keeps its data: the store interface (`base`), the SQL both engines
run (`sql`), and the engines (`sqlite`, the embedded default; `postgres`, optional)."""
