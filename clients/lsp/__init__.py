"""`ctxd lsp`: a language server that shows ctxd's sessions in any LSP editor.

`core` is a client of the shared daemon and knows nothing of LSP; `documents` renders
sessions as Markdown documents; `server` maps LSP requests onto the core (pygls).
"""
