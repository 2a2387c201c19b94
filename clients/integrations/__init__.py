"""Drop-in ctxd memory for agent frameworks.

Each module imports its framework, so import only the one you use (install the
matching extra): `openai_agents` (extra `agents`), `langchain` (extra `langchain`).
"""
