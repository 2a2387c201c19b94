-- Headless Neovim (0.7+) driving `ctxd lsp` through vim.lsp, as a user would; the test
-- (tests/test_lsp_nvim.py) plays the agent and the CLI meanwhile. Results go to a JSON file.
-- Every wait is a deadline polled for its condition, generous because a loaded 2-core
-- machine can take tens of seconds to start `ctxd lsp` and answer; quick runs end early.
local PATIENCE_MS = 300000
local function env(name)
  local value = os.getenv(name)
  assert(value, "missing environment variable " .. name)
  return value
end
local out = { asked = {}, progress = {}, messages = {}, statuses = 0 }
local sid = env("CTXD_SESSION")

local function finish()
  pcall(function() vim.fn.writefile({ vim.fn.json_encode(out) }, env("CTXD_OUT")) end)
  vim.cmd("qa!")
end

local handlers = {
  -- the human at the editor: approve what the agent asks
  ["window/showMessageRequest"] = function(_, result)
    table.insert(out.asked, result.message)
    return { title = "Approve" }
  end,
  ["$/progress"] = function(_, result)
    table.insert(out.progress, result.value.kind)
  end,
  ["window/showMessage"] = function(_, result)
    table.insert(out.messages, result.message)
  end,
  ["ctxd/status"] = function(_, result)
    if result.connected then out.statuses = out.statuses + 1 end
    out.status = result
  end,
}
local modern = vim.lsp.config ~= nil -- 0.11+: vim.lsp.config / vim.lsp.enable, as documented

local ok, err = pcall(function()
  local id
  if modern then
    vim.lsp.config("ctxd", {
      cmd = vim.fn.json_decode(env("CTXD_LSP_CMD")),
      root_markers = { ".git", "notes.md" },
      handlers = handlers,
    })
    vim.lsp.enable("ctxd")
    -- a file of the project attaches the server (on its FileType event)
    vim.cmd("filetype on")
    vim.cmd("edit " .. vim.fn.fnameescape(env("CTXD_ROOT") .. "/notes.md"))
    assert(vim.wait(PATIENCE_MS, function() return #vim.lsp.get_clients({ name = "ctxd" }) > 0 end, 20),
      "vim.lsp.enable did not start the server")
    id = vim.lsp.get_clients({ name = "ctxd" })[1].id
  else
    id = vim.lsp.start_client({
      name = "ctxd",
      cmd = vim.fn.json_decode(env("CTXD_LSP_CMD")),
      root_dir = env("CTXD_ROOT"),
      handlers = handlers,
    })
  end
  out.version = tostring(vim.version().major) .. "." .. tostring(vim.version().minor)
  local client
  assert(vim.wait(PATIENCE_MS, function()
    client = vim.lsp.get_client_by_id(id)
    return client ~= nil and client.initialized and out.statuses > 0
  end, 20), "the server did not initialize and connect")
  out.commands = client.server_capabilities.executeCommandProvider.commands
  vim.fn.writefile({ "ready" }, env("CTXD_READY"))

  -- the test now requests an approval from a Python client and compacts from the CLI
  assert(vim.wait(PATIENCE_MS, function()
    return #out.asked > 0 and vim.tbl_contains(out.progress, "end")
  end, 20), "no approval prompt or no compaction progress")

  local function request(method, params)
    local resp
    if modern then
      resp = client:request_sync(method, params, PATIENCE_MS, 0)
    else
      resp = client.request_sync(method, params, PATIENCE_MS, 0)
    end
    assert(resp, method .. " timed out")
    assert(not resp.err, method .. ": " .. vim.inspect(resp.err))
    return resp.result
  end

  -- search the agent's past with the editor's symbol search, then read the document
  local symbols = request("workspace/symbol", { query = "生产数据库" })
  out.symbols = vim.tbl_map(function(s) return s.name end, symbols)
  local loc = symbols[1].location
  vim.cmd("edit " .. vim.fn.fnameescape(vim.uri_to_fname(loc.uri)))
  out.symbol_line = vim.fn.getline(loc.range.start.line + 1)
  out.symbol_next = vim.fn.getline(loc.range.start.line + 2)

  -- a command: open the session's context document (0.7 has no showDocument: open it)
  local opened = request("workspace/executeCommand",
    { command = "ctxd.openSession", arguments = { { sessionId = sid } } })
  vim.cmd("edit " .. vim.fn.fnameescape(vim.uri_to_fname(opened.uri)))
  local buf = vim.api.nvim_get_current_buf()
  out.context = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
  vim.lsp.buf_attach_client(buf, id)
  -- go to the archive message a summary pointer cites
  for lnum, line in ipairs(out.context) do
    local s = line:find(" #%d+")
    if line:sub(1, 2) == "- " and s then
      out.pointer = line:match("#(%d+)", s)
      local def = request("textDocument/definition", {
        textDocument = { uri = opened.uri },
        position = { line = lnum - 1, character = s },
      })
      def = def[1] or def
      vim.cmd("edit " .. vim.fn.fnameescape(vim.uri_to_fname(def.uri)))
      out.definition_line = vim.fn.getline(def.range.start.line + 1)
      local links = request("textDocument/documentLink", { textDocument = { uri = opened.uri } })
      out.links = #links
      local hover = request("textDocument/hover", {
        textDocument = { uri = opened.uri },
        position = { line = lnum - 1, character = s },
      })
      out.hover = hover.contents.value
      break
    end
  end
  out.pinned = request("workspace/executeCommand",
    { command = "ctxd.pin", arguments = { { sessionId = sid, text = "pinned from Neovim" } } })
  out.shown = opened.shown
  vim.lsp.stop_client(id)
end)
if not ok then out.error = tostring(err) end
finish()
