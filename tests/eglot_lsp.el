;;; eglot_lsp.el --- Emacs (batch) driving `ctxd lsp' through eglot -*- lexical-binding: t -*-
;; tests/test_lsp_eglot.py plays the agent and the CLI meanwhile; results go to a JSON file.
(require 'eglot)
(require 'json)

;; A loaded machine can take many seconds to start `ctxd lsp' (a Python process) and to
;; answer: eglot's defaults (wait 3 s, then connect in the background; requests time out
;; after 10 s) fail there. Every wait below is a deadline polled for its condition, so a
;; generous one costs nothing when things are quick.
(setq eglot-sync-connect t)
(setq eglot-connect-timeout 300)
(setq jsonrpc-default-request-timeout 120)
(defconst ctxd-patience 300 "Seconds to wait for something the test will do.")

(defvar ctxd-out (list (cons 'messages []) (cons 'notifications [])))
(defun ctxd-put (key value) (setf (alist-get key ctxd-out) value))
(defun ctxd-push (key value)
  (ctxd-put key (vconcat (alist-get key ctxd-out) (vector value))))
(defun ctxd-wait (pred seconds)
  (let ((deadline (+ (float-time) seconds)))
    (while (and (not (funcall pred)) (< (float-time) deadline))
      (accept-process-output nil 0.05))
    (funcall pred)))
(defun ctxd-finish ()
  (with-temp-file (getenv "CTXD_OUT") (insert (json-encode ctxd-out)))
  (kill-emacs 0))

;; eglot 1.9 declares no window capabilities, so the server shows an approval as a
;; message and offers it as code actions; progress is not sent, `ctxd/status' is.
(advice-add 'eglot-handle-notification :before
            (lambda (_server method &rest params)
              (ctxd-push 'notifications (format "%s" method))
              (when (eq method 'window/showMessage)
                (ctxd-push 'messages (plist-get params :message)))))
(defun ctxd-approval-message ()
  (seq-find (lambda (m) (string-match-p "ctxd.resolveApproval" m))
            (alist-get 'messages ctxd-out)))

(condition-case err
    (let* ((root (getenv "CTXD_ROOT"))
           (sid (getenv "CTXD_SESSION"))
           (cmd (append (json-read-from-string (getenv "CTXD_LSP_CMD")) nil)))
      (setq project-find-functions (list (lambda (_dir) (cons 'transient root))))
      (setq eglot-server-programs (list (cons 'text-mode cmd)))
      (find-file (expand-file-name "notes.txt" root))
      (text-mode)
      (apply #'eglot (eglot--guess-contact))
      (let ((server (eglot-current-server)))
        (unless server (error "eglot did not connect"))
        (ctxd-put 'commands (plist-get (plist-get (eglot--capabilities server)
                                                  :executeCommandProvider)
                                       :commands))
        (with-temp-file (getenv "CTXD_READY") (insert "ready"))
        (unless (ctxd-wait #'ctxd-approval-message ctxd-patience)
          (error "no approval message"))
        ;; what the user does: M-x eglot-code-actions, pick "ctxd: approve ..."
        (let* ((actions (jsonrpc-request
                         server :textDocument/codeAction
                         (list :textDocument (eglot--TextDocumentIdentifier)
                               :range (list :start '(:line 0 :character 0)
                                            :end '(:line 0 :character 0))
                               :context '(:diagnostics []))))
               (approve (seq-find (lambda (a) (string-prefix-p "ctxd: approve"
                                                               (plist-get a :title)))
                                  actions))
               (command (plist-get approve :command)))
          (ctxd-put 'action (plist-get approve :title))
          (ctxd-put 'resolved (eglot-execute-command server (plist-get command :command)
                                                     (plist-get command :arguments))))
        ;; the test compacts from the CLI now; the status notification shows it
        (unless (ctxd-wait (lambda () (file-exists-p (getenv "CTXD_COMPACTED")))
                          ctxd-patience)
          (error "the test did not compact"))
        ;; the status notifications the test asserts on (one may have come already)
        (ctxd-wait (lambda () (>= (seq-count (lambda (n) (equal n "ctxd/status"))
                                             (alist-get 'notifications ctxd-out))
                                  2))
                   ctxd-patience)
        (let* ((syms (jsonrpc-request server :workspace/symbol '(:query "生产数据库")))
               (sym (aref syms 0))
               (loc (plist-get sym :location))
               (line (plist-get (plist-get (plist-get loc :range) :start) :line)))
          (ctxd-put 'symbols (mapcar (lambda (s) (plist-get s :name)) syms))
          (with-current-buffer (find-file-noselect (eglot--uri-to-path (plist-get loc :uri)))
            (goto-char (point-min))
            (forward-line (1+ line))
            (ctxd-put 'symbol_next (buffer-substring (line-beginning-position)
                                                     (line-end-position)))))
        (let* ((opened (jsonrpc-request server :workspace/executeCommand
                                        (list :command "ctxd.openSession"
                                              :arguments (vector (list :sessionId sid)))))
               (path (eglot--uri-to-path (plist-get opened :uri))))
          (with-current-buffer (find-file-noselect path)
            (ctxd-put 'context (buffer-string))))))
  (error (ctxd-put 'error (format "%S" err))))
(ctxd-finish)
