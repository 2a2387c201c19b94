"""Where the engine keeps its data: the store interface (`base`) and its implementations
(`sqlite`, the embedded default)."""
