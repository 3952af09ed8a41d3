/*
 * The chat page (streamrecover.chat): posts its form (asking for JSON: the view answers with the
 * new run) and renders what StreamRecoverClient rebuilds from the run's WebSocket, incrementally:
 * a delta appends to its block, so earlier messages (and a reader's selection in them) stay put.
 * Without JavaScript the same form posts as a page and the view redirects to the thread. Model
 * output and user text go in as textContent (or text nodes) only.
 * window.__streamrecover exposes the client and what happened, for people and tests.
 */
(function () {
  "use strict";

  var config = JSON.parse(document.getElementById("sr-config").textContent);
  var el = {
    transcript: document.getElementById("sr-transcript"),
    status: document.getElementById("sr-status"),
    recovery: document.getElementById("sr-recovery"),
    connection: document.getElementById("sr-connection"),
    error: document.getElementById("sr-error"),
    form: document.getElementById("sr-form"),
    prompt: document.getElementById("sr-prompt"),
    send: document.getElementById("sr-send"),
    cancel: document.getElementById("sr-cancel"),
    threads: document.getElementById("sr-thread-list"),
  };
  var page = (window.__streamrecover = {
    client: null,
    runId: config.runId,
    threadId: config.threadId,
    status: null,
    recoveries: [],
    snapshots: [],
    errors: [],
    cancelling: false, // Cancel was clicked and the run has not ended yet
    threadWatch: null, // hears of the runs started in the thread, in this page or another
  });
  var renderQueued = false;
  var cancelLabel = el.cancel.textContent; // the template's own (translated) wording
  var INTERRUPTED = "Stream interrupted \u2014 reconnecting\u2026";
  var busyError = null; // "this thread has a run in progress", shown while that run goes on

  function node(tag, className, text) {
    var n = document.createElement(tag);
    if (className) n.className = className;
    if (text !== undefined) n.textContent = text;
    return n;
  }

  function toolText(block) {
    var args = block.input !== undefined ? JSON.stringify(block.input) : block.partial_json || "";
    return "\u{1F527} " + (block.name || "tool") + "(" + args + ")";
  }

  function blockNode(block) {
    var kind = block.type;
    if (kind === "text") return node("div", "sr-text", block.text);
    if (kind === "thinking") {
      var details = node("details", "sr-thinking");
      details.appendChild(node("summary", "", "thinking"));
      details.appendChild(node("div", "", block.thinking));
      return details;
    }
    if (kind === "tool_use") return node("div", "sr-tool", toolText(block));
    if (kind === "tool_result") {
      var content = typeof block.content === "string" ? block.content : JSON.stringify(block.content);
      return node("div", "sr-tool-result", "\u21B3 " + content);
    }
    if (kind === "redacted_thinking") return node("div", "sr-thinking", "[redacted thinking]");
    return node("div", "sr-thinking", "[" + kind + "]");
  }

  /* A message's <li> with its role line; the blocks go after it. */
  function messageItem(role) {
    var li = node("li", "sr-msg");
    li.dataset.role = role;
    var label = node("div", "sr-role", role);
    li.appendChild(label);
    return { li: li, label: label };
  }

  /* state: "committed", "streaming", or the run's final status for blocks never committed. */
  /* A user message that only carries tool results: the provider's shape puts them in a user
   * turn, but the reader did not write them. */
  function roleLabel(message) {
    var content = message.content || [];
    if (message.role === "user" && content.length && content.every(function (b) { return b && b.type === "tool_result"; })) {
      return "tool results";
    }
    return message.role;
  }

  function setItemState(item, role, state) {
    item.li.dataset.streaming = state === "streaming" ? "true" : "false";
    item.li.dataset.committed = state === "committed" ? "true" : "false";
    var label = role;
    if (state === "streaming") label += " \u00b7 streaming";
    else if (state !== "committed") label += " \u00b7 " + state + " (not kept)";
    item.label.textContent = label;
  }

  function messageNode(message, state) {
    var item = messageItem(message.role);
    setItemState(item, roleLabel(message), state);
    (message.content || []).forEach(function (block) {
      item.li.appendChild(blockNode(block));
    });
    return item.li;
  }

  function partialBlock(block) {
    if (block.kind === "tool_use") return { type: "tool_use", name: block.name, partial_json: block.arguments };
    return StreamRecoverClient.blockToContent(block);
  }

  /*
   * What the transcript shows, kept so that a frame changes only what it touches: a delta
   * appends to its block's text node; a new or replaced block, a dropped one (tool_call_cancel,
   * block_cancel, stream_reset), a committed message or a snapshot rebuild only the <li> or
   * block that differs. committed[i] is {message, key, li} for client.messages[i]; streaming
   * is the in-flight turn's <li> with its blocks by index.
   */
  var view = { client: null, committed: [], streaming: null, committedChanged: false };

  /* The string of an in-flight block that its deltas make grow (null: a block shown whole). */
  function growingText(block) {
    if (block.kind === "text" || block.kind === "thinking") return block.text;
    if (block.kind === "tool_use") return block.arguments;
    return null;
  }

  function streamingBlock(block) {
    var grows = growingText(block);
    var shown = { kind: block.kind, name: block.name, ref: block, args: block.arguments, text: grows, tail: null };
    if (grows === null) {
      shown.node = blockNode(partialBlock(block));
      return shown;
    }
    shown.tail = document.createTextNode(grows);
    if (block.kind === "text") {
      shown.node = node("div", "sr-text");
      shown.node.appendChild(shown.tail);
    } else if (block.kind === "thinking") {
      shown.node = node("details", "sr-thinking");
      shown.node.appendChild(node("summary", "", "thinking"));
      var body = node("div", "");
      body.appendChild(shown.tail);
      shown.node.appendChild(body);
    } else {
      shown.node = node("div", "sr-tool", "\u{1F527} " + (block.name || "tool") + "(");
      shown.node.appendChild(shown.tail);
      shown.node.appendChild(document.createTextNode(")"));
    }
    return shown;
  }

  /* The shown block brought up to date in place, or null when it must be built again. */
  function updatedBlock(shown, block) {
    if (!shown || shown.kind !== block.kind || shown.name !== block.name) return null;
    var grows = growingText(block);
    if (grows === null) return shown.ref === block && shown.args === block.arguments ? shown : null;
    // the same entry only ever grows; another one (from a snapshot) is kept if it goes on from it
    if (grows.length < shown.text.length || (shown.ref !== block && !grows.startsWith(shown.text))) return null;
    if (grows.length > shown.text.length) shown.tail.appendData(grows.slice(shown.text.length));
    shown.text = grows;
    shown.ref = block;
    return shown;
  }

  function renderCommitted(messages) {
    var before = view.streaming ? view.streaming.li : null;
    for (var i = 0; i < messages.length; i++) {
      var message = messages[i];
      var shown = view.committed[i];
      if (shown && shown.message === message) continue;
      // a snapshot (or a commit confirming a message it read) sends an equal copy: keep its node
      var key = StreamRecoverClient.canonical(message);
      if (shown && shown.key === key) {
        shown.message = message;
        continue;
      }
      var li = messageNode(message, "committed");
      if (shown) el.transcript.replaceChild(li, shown.li);
      else el.transcript.insertBefore(li, before);
      view.committed[i] = { message: message, key: key, li: li };
    }
    view.committed.splice(messages.length).forEach(function (gone) {
      gone.li.remove();
    });
  }

  function renderStreaming(client) {
    var entries = client.partialBlocks();
    var item = view.streaming;
    if (!entries.length) {
      if (item) item.li.remove();
      view.streaming = null;
      return;
    }
    if (!item) {
      item = view.streaming = messageItem("assistant");
      item.state = null;
      item.blocks = new Map();
      el.transcript.appendChild(item.li);
    }
    var state = client.isTerminal() ? client.status : "streaming";
    if (item.state !== state) setItemState(item, "assistant", state);
    item.state = state;
    var present = new Set(entries.map(function (e) { return e[0]; }));
    item.blocks.forEach(function (shown, index) {
      if (!present.has(index)) {
        shown.node.remove();
        item.blocks.delete(index);
      }
    });
    var previous = item.label;
    entries.forEach(function (entry) {
      var old = item.blocks.get(entry[0]);
      var shown = updatedBlock(old, entry[1]);
      if (!shown) {
        shown = streamingBlock(entry[1]);
        if (old) old.node.remove();
        item.blocks.set(entry[0], shown);
      }
      if (previous.nextSibling !== shown.node) item.li.insertBefore(shown.node, previous.nextSibling);
      previous = shown.node;
    });
  }

  function render() {
    renderQueued = false;
    var client = page.client;
    if (!client) return;
    if (view.client !== client) {
      // the page's first client replaces the server-rendered transcript; a later one (the next
      // run in the thread) keeps every message its snapshot still holds
      if (view.client === null) el.transcript.replaceChildren();
      view.client = client;
      view.committedChanged = true;
    }
    if (view.committedChanged) {
      view.committedChanged = false;
      renderCommitted(client.messages);
    }
    renderStreaming(client);
  }

  function scheduleRender() {
    if (renderQueued) return;
    renderQueued = true;
    (window.requestAnimationFrame || setTimeout)(render);
  }

  function isActive(status) {
    return status === "queued" || status === "running" || status === "recovering";
  }

  function setCancelling(on) {
    page.cancelling = on;
    el.cancel.textContent = on ? "Cancelling\u2026" : cancelLabel;
    el.cancel.disabled = on || !isActive(page.status);
  }

  function setStatus(status) {
    page.status = status;
    el.status.dataset.status = status || "";
    el.status.textContent = status || "idle";
    var active = isActive(status);
    if (!active && page.cancelling) setCancelling(false); // the run has ended: cancelled or not
    if (!active && busyError !== null) {
      if (el.error.textContent === busyError) showError(""); // it is over: the thread takes a message again
      busyError = null;
    }
    el.cancel.disabled = !active || page.cancelling;
    el.send.disabled = active;
    if (status === "recovering" && el.recovery.hidden) {
      // a page opened (or reloaded) during a backoff never saw the frame of the break: say it all the same
      el.recovery.dataset.phase = "backoff";
      el.recovery.textContent = INTERRUPTED;
      el.recovery.hidden = false;
    } else if (status === "running" && el.recovery.dataset.phase === "backoff") {
      el.recovery.hidden = true; // going on again, and the frame that says how was missed (a snapshot)
    }
    if (!active && el.recovery.dataset.phase !== "exhausted" && el.recovery.dataset.phase !== "recovered") {
      el.recovery.hidden = true;
    }
  }

  function showRecovery(frame) {
    page.recoveries.push({ phase: frame.phase, plan: frame.plan, attempt: frame.attempt });
    var phase = frame.phase;
    var text;
    if (phase === "backoff") {
      text = INTERRUPTED + " (attempt " + frame.attempt + ", plan " + frame.plan +
        ", retry in " + Number(frame.backoff_s || 0).toFixed(1) + " s)";
      setStatus("recovering");
    } else if (phase === "continuing" && frame.plan === "whole_restart") {
      // nothing of the answer could be kept (the client was reset): it starts over, not on
      text = "Reconnected \u2014 nothing could be kept, the answer starts over (attempt " + frame.attempt + ", " +
        frame.plan + ")";
    } else if (phase === "continuing") {
      text = "Reconnected \u2014 continuing from where it stopped (attempt " + frame.attempt + ", " + frame.plan + ")";
    } else {
      // frame.attempt counts continuations (the run has one attempt more): said as the error says it
      text = "Gave up after " + frame.attempt + " continuation attempts (" + frame.plan + ")";
    }
    el.recovery.dataset.phase = phase;
    el.recovery.textContent = text;
    el.recovery.hidden = false;
  }

  function onFrame(frame) {
    if (frame.type === "snapshot" || frame.type === "message_committed") view.committedChanged = true;
    if (frame.type === "snapshot") {
      page.snapshots.push({ seq: frame.seq, status: frame.status, partial: (frame.partial || []).length });
    }
    if (el.recovery.dataset.phase === "continuing" && /_delta$/.test(frame.type)) {
      var restarted = page.recoveries.length && page.recoveries[page.recoveries.length - 1].plan === "whole_restart";
      el.recovery.dataset.phase = "recovered";
      el.recovery.textContent = restarted ? "Recovered: the answer started over after the break."
        : "Recovered: the answer went on after the break.";
      if (page.status === "recovering") setStatus("running");
    }
  }

  function showConnection(state, attempt) {
    if (state === "reconnecting") {
      el.connection.textContent = "Connection to the server lost \u2014 reconnecting\u2026 (" + attempt + ")";
      el.connection.hidden = false;
    } else if (state === "open" || state === "closed") {
      el.connection.hidden = true;
    }
    // A cancel asked for while the socket was down (and the API out of reach) goes now; one sent
    // on a socket that then dropped may have been lost, and asking twice cancels once.
    if (state === "open" && page.cancelling) page.client.cancel();
  }

  function showError(message) {
    if (message) page.errors.push(message);
    el.error.textContent = message;
    el.error.hidden = !message;
  }

  function socketUrl(path) {
    var url = new URL(path, window.location.href);
    url.protocol = window.location.protocol === "https:" ? "wss:" : "ws:";
    return url.toString();
  }

  function follow(runId, wsPath) {
    if (page.client && page.runId === runId) return; // already followed (announced, then posted)
    if (page.client) page.client.close();
    setCancelling(false);
    page.runId = runId;
    var client = new StreamRecoverClient(socketUrl(wsPath), {
      onRender: scheduleRender,
      onStatus: function (status, error) {
        setStatus(status);
        if (error && error.message && status !== "cancelled") showError(error.kind + ": " + error.message);
      },
      onRecovery: showRecovery,
      onFrame: onFrame,
      onError: function (frame) {
        // it ended before the cancel (perhaps one repeated after a reconnect): its status says how
        if (frame.code === "not_cancellable" && (page.cancelling || client.isTerminal())) return;
        if (frame.code === "forbidden") setCancelling(false);
        showError(frame.message || frame.code);
      },
      onConnection: showConnection,
    });
    page.client = client;
    client.connect();
  }

  /* A run started in this thread by another page (or this one): shown here as it streams. */
  function followStarted(frame) {
    if (frame.run_id === page.runId) return;
    showError("");
    el.recovery.hidden = true; // the notice of the run before
    el.recovery.dataset.phase = "";
    setStatus("queued");
    follow(frame.run_id, config.urls.runSocket.replace("{id}", frame.run_id));
  }

  function watchThread(threadId) {
    // (a host's get_config may leave the thread's socket out: the page then follows only its own runs)
    if (page.threadWatch || !threadId || !config.urls.threadSocket) return;
    page.threadWatch = new StreamRecoverClient.ThreadWatch(
      socketUrl(config.urls.threadSocket.replace("{id}", threadId)),
      { onRun: followStarted }
    );
    page.threadWatch.connect();
  }

  function csrfToken() {
    var input = el.form.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  function addThreadLink(threadId, title) {
    var empty = document.getElementById("sr-no-threads");
    if (empty) empty.remove();
    var li = node("li");
    var a = node("a", "", title);
    a.href = config.urls.thread.replace("{id}", threadId);
    a.setAttribute("aria-current", "page");
    li.appendChild(a);
    el.threads.prepend(li);
  }

  el.form.addEventListener("submit", function (event) {
    event.preventDefault();
    var text = el.prompt.value.trim();
    if (!text) {
      showError("This field is required."); // spaces pass the box's "required": say what the server says
      return;
    }
    var body = new FormData(el.form);
    showError("");
    el.recovery.hidden = true;
    el.recovery.dataset.phase = "";
    el.send.disabled = true;
    fetch(el.form.action, {
      method: "POST",
      credentials: "same-origin",
      headers: { Accept: "application/json", "X-CSRFToken": csrfToken() },
      body: body,
    })
      .then(function (response) {
        return response.json().then(function (data) {
          if (!response.ok) {
            var failure = new Error(data.error || "HTTP " + response.status);
            failure.busy = response.status === 409 && data.run_id ? data : null; // the run the thread is busy with
            throw failure;
          }
          return data;
        });
      })
      .then(function (data) {
        if (!page.threadId) addThreadLink(data.thread_id, data.title);
        page.threadId = data.thread_id;
        el.form.action = config.urls.thread.replace("{id}", data.thread_id);
        window.history.replaceState(null, "", el.form.action);
        el.prompt.value = "";
        if (data.run_id !== page.runId) {
          setStatus(data.status);
          follow(data.run_id, data.ws_url);
        }
        watchThread(data.thread_id);
      })
      .catch(function (err) {
        el.send.disabled = false;
        showError(err.message);
        // another tab's run: show it here (its Cancel too); the typed words stay for when it is over
        if (err.busy) {
          busyError = err.message;
          if (err.busy.run_id !== page.runId) {
            setStatus(err.busy.status);
            follow(err.busy.run_id, err.busy.ws_url);
          }
        }
      });
  });

  /* The socket is down (reconnecting): the JSON API carries the cancel instead. */
  function cancelOverApi(runId) {
    fetch(config.urls.cancel.replace("{id}", runId), {
      method: "POST",
      credentials: "same-origin",
      headers: { Accept: "application/json", "X-CSRFToken": csrfToken() },
    }).then(
      function (response) {
        if (response.ok || runId !== page.runId) return;
        return response.json().then(
          function (data) { return data.error || "HTTP " + response.status; },
          function () { return "HTTP " + response.status; }
        ).then(function (message) {
          setCancelling(false);
          showError(message);
        });
      },
      function () {
        // the server is out of reach too: the socket sends it once it is open again (showConnection)
      }
    );
  }

  el.cancel.addEventListener("click", function () {
    if (!page.client || page.cancelling) return;
    setCancelling(true);
    if (!page.client.cancel()) cancelOverApi(page.runId);
  });

  if (config.runId) follow(config.runId, config.wsUrl);
  watchThread(config.threadId);
})();
