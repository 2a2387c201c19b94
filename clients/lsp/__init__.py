"""`ctxd lsp`: a language server that shows ctxd's sessions in any LSP editor.

`core` is a client of the shared daemon and knows nothing of LSP; `documents` renders
sessions as Markdown documents; `language_server` holds the pygls server object
(`SERVER`), on which `server` (the features) and `commands` (the commands, code actions
and lenses) register their module-level handlers.
"""
