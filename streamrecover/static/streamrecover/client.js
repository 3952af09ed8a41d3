/*
 * streamrecover client: follows one run over its WebSocket and rebuilds what to show.
 *
 * Frames are applied with exactly the rules of streamrecover/engine/protocol.py (the
 * reducer the tests' reference client builds on): deltas append to the in-flight block they
 * name (a server tool call's input too, after the block frame that announced it), citation
 * frames append to a text block's citations, a block frame (re)places a whole block,
 * tool_call_cancel / block_cancel drop one block, stream_reset drops them all, message_committed moves the turn into the committed messages (at its position: one a snapshot already holds is replaced, not added again), a snapshot replaces
 * everything. A coalesced frame covers seqs first_seq..seq; any other jump means a frame
 * was lost, and the client asks for a fresh snapshot ("resync"). A dropped socket is
 * reopened with backoff and ?after=<last seq>, so the server replays only what was missed.
 *
 * No dependencies, no build step. Nothing here touches the DOM: render in the callbacks,
 * and put model output into the page as text (textContent), never as HTML.
 *
 *   const client = new StreamRecoverClient("wss://host/ws/streamrecover/runs/<id>/", {
 *     onRender(client) {}, onStatus(status, error) {}, onRecovery(frame) {},
 *     onError(frame) {}, onConnection(state, attempt) {},
 *   });
 *   client.connect();  client.cancel();  client.close();
 *
 * StreamRecoverClient.ThreadWatch follows a thread instead: which runs start in it.
 *
 *   const watch = new StreamRecoverClient.ThreadWatch("wss://host/ws/streamrecover/threads/<id>/", {
 *     onRun(frame) {},  // frame.run_id: a run to follow with a StreamRecoverClient
 *   });
 *   watch.connect();  watch.close();
 */
(function (root) {
  "use strict";

  var TERMINAL = ["completed", "failed", "exhausted", "cancelled"];
  var FORBIDDEN = 4403; // the server's "not yours": reconnecting would not help
  var DELAYS_MS = [250, 500, 1000, 2000, 4000, 8000];

  function noop() {}

  // A message's frame, or null for one that is not JSON (ignored: the next frame or snapshot tells)
  function parseFrame(event) {
    try {
      return JSON.parse(event.data);
    } catch (e) {
      return null;
    }
  }

  function blockFromContent(content) {
    var kind = content.type || "";
    if (kind === "text") {
      var cited = content.citations && content.citations.length ? content.citations.slice() : null;
      // a snapshot's in-flight refusal says so, as its text_delta frames did
      return { kind: "text", text: content.text || "", citations: cited, refusal: content.refusal === true };
    }
    if (kind === "thinking") return { kind: "thinking", text: content.thinking || "" };
    var raw = typeof content.partial_json === "string" ? content.partial_json : null;
    if (kind === "tool_use") {
      var args = raw !== null ? raw : JSON.stringify(content.input);
      return { kind: "tool_use", id: content.id, name: content.name, arguments: args };
    }
    var whole = Object.assign({}, content);
    delete whole.partial_json;
    return { kind: kind, content: whole, arguments: raw !== null ? raw : "" };
  }

  /* A tool call's arguments as shown (unparseable ones as __unparsed__). */
  function shownInput(args) {
    try {
      return args.trim() ? JSON.parse(args) : {};
    } catch (e) {
      return { __unparsed__: args };
    }
  }

  function blockToContent(block) {
    if (block.kind === "text") {
      if (block.citations && block.citations.length) {
        return { type: "text", text: block.text, citations: block.citations.slice() };
      }
      return { type: "text", text: block.text };
    }
    if (block.kind === "thinking") return { type: "thinking", thinking: block.text };
    if (block.kind === "tool_use") {
      return { type: "tool_use", id: block.id, name: block.name, input: shownInput(block.arguments) };
    }
    var content = Object.assign({}, block.content || { type: block.kind });
    // a server tool call's input, streamed as tool_call_delta frames after its block frame
    if (block.arguments) content.input = shownInput(block.arguments);
    return content;
  }

  /* A block without what the client is never sent (thinking and function-call signatures:
   * a Gemini function call's thought signature is in its committed message, never in a frame). */
  function comparable(block) {
    if (block.type === "thinking") return { type: "thinking", thinking: block.thinking || "" };
    if (block.type === "tool_use" && "signature" in block) {
      var call = Object.assign({}, block);
      delete call.signature;
      return call;
    }
    return block;
  }

  /* JSON with sorted keys, to compare blocks whatever their key order. */
  function canonical(value) {
    if (Array.isArray(value)) return "[" + value.map(canonical).join(",") + "]";
    if (value && typeof value === "object") {
      return "{" + Object.keys(value).sort().filter(function (k) { return value[k] !== undefined; })
        .map(function (k) { return JSON.stringify(k) + ":" + canonical(value[k]); }).join(",") + "}";
    }
    return JSON.stringify(value === undefined ? null : value);
  }

  function StreamRecoverClient(url, options) {
    options = options || {};
    this.url = url;
    this.onRender = options.onRender || noop;
    this.onStatus = options.onStatus || noop;
    this.onRecovery = options.onRecovery || noop;
    this.onError = options.onError || noop;
    this.onConnection = options.onConnection || noop;
    this.onFrame = options.onFrame || noop;
    this.WebSocketImpl = options.WebSocket || root.WebSocket;
    this.delays = options.delaysMs || DELAYS_MS;
    this.messages = [];
    this.partial = new Map();
    this.status = null;
    this.error = null;
    this.lastSeq = 0;
    this.synced = false; // a snapshot (or a replay on top of one) has been applied
    this.awaitingSnapshot = false;
    this.closed = false;
    this.socket = null;
    this.attempt = 0;
    this.timer = null;
    // What the page (and the tests) can check: every committed assistant turn is compared
    // with what this client rebuilt from the frames.
    this.stats = { frames: 0, gaps: 0, resyncs: 0, reconnects: 0, checked: 0, mismatches: 0 };
  }

  StreamRecoverClient.prototype.connect = function () {
    var self = this;
    this.closed = false;
    var url = this.url;
    if (this.synced) url += (url.indexOf("?") >= 0 ? "&" : "?") + "after=" + this.lastSeq;
    var socket = new this.WebSocketImpl(url);
    this.socket = socket;
    this.awaitingSnapshot = false;
    this.onConnection(this.attempt ? "reconnecting" : "connecting", this.attempt);
    socket.onopen = function () {
      if (socket !== self.socket) return;
      self.attempt = 0;
      self.onConnection("open", 0);
    };
    socket.onmessage = function (event) {
      if (socket !== self.socket) return;
      var frame = parseFrame(event);
      if (frame !== null) self.handle(frame);
    };
    socket.onclose = function (event) {
      if (socket !== self.socket) return;
      self.socket = null;
      // Only close() or a refusal ends the client; any other close (1000 included: that is
      // what servers echo to a close they did not start) is a connection to get back.
      if (self.closed || event.code === FORBIDDEN || self.isTerminal()) {
        self.onConnection("closed", 0, event.code);
        return;
      }
      self.scheduleReconnect();
    };
  };

  StreamRecoverClient.prototype.scheduleReconnect = function () {
    var self = this;
    var base = this.delays[Math.min(this.attempt, this.delays.length - 1)];
    var delay = base * (0.8 + Math.random() * 0.4);
    this.attempt += 1;
    this.stats.reconnects += 1;
    this.onConnection("reconnecting", this.attempt, delay);
    this.timer = setTimeout(function () {
      self.timer = null;
      if (!self.closed) self.connect();
    }, delay);
  };

  StreamRecoverClient.prototype.send = function (message) {
    if (this.socket && this.socket.readyState === 1) {
      this.socket.send(JSON.stringify(message));
      return true;
    }
    return false;
  };

  StreamRecoverClient.prototype.cancel = function () {
    return this.send({ type: "cancel" });
  };

  StreamRecoverClient.prototype.resync = function () {
    if (this.send({ type: "resync" })) {
      this.awaitingSnapshot = true;
      this.stats.resyncs += 1;
    }
  };

  /* Close the socket the way a network failure would: the client reconnects with ?after=. */
  StreamRecoverClient.prototype.dropConnection = function () {
    if (this.socket) this.socket.close(4000, "dropped by client");
  };

  StreamRecoverClient.prototype.close = function () {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.socket) this.socket.close(1000);
    this.socket = null;
  };

  StreamRecoverClient.prototype.isTerminal = function () {
    return TERMINAL.indexOf(this.status) >= 0;
  };

  StreamRecoverClient.prototype.handle = function (frame) {
    var kind = frame.type;
    if (kind === "error") {
      this.onError(frame);
      return;
    }
    if (kind === "snapshot") {
      this.awaitingSnapshot = false;
      this.apply(frame);
      this.synced = true;
      this.stats.frames += 1;
      this.onFrame(frame);
      this.onStatus(this.status, this.error);
      this.onRender(this);
      return;
    }
    if (this.awaitingSnapshot) return; // the snapshot on its way already includes it
    var seq = frame.seq || 0;
    var first = frame.first_seq || seq;
    if (seq <= this.lastSeq) return; // already applied
    if (first !== this.lastSeq + 1) {
      this.stats.gaps += 1;
      this.resync();
      return;
    }
    this.apply(frame);
    this.stats.frames += 1;
    this.onFrame(frame);
    if (kind === "recovery") this.onRecovery(frame);
    if (kind === "run_status") this.onStatus(this.status, this.error);
    this.onRender(this);
  };

  /* The reference rules (engine/protocol.py FrameReducer.apply). */
  StreamRecoverClient.prototype.apply = function (frame) {
    var kind = frame.type;
    var block = frame.block;
    var partial = this.partial;
    this.lastSeq = frame.seq || 0;
    if (kind === "text_delta") {
      if (!partial.has(block)) partial.set(block, { kind: "text", text: "" });
      var text = partial.get(block);
      text.text += frame.text;
      if (frame.refusal === true) text.refusal = true; // the model's refusal (a UI may show it as one)
    } else if (kind === "thinking_delta") {
      if (!partial.has(block)) partial.set(block, { kind: "thinking", text: "" });
      partial.get(block).text += frame.thinking;
    } else if (kind === "tool_call_delta") {
      // also a server tool call's input, after the block frame that announced it
      if (!partial.has(block)) partial.set(block, { kind: "tool_use", id: frame.id, name: frame.name, arguments: "" });
      var entry = partial.get(block);
      entry.arguments = (entry.arguments || "") + (frame.arguments_delta || "");
    } else if (kind === "citation") {
      if (!partial.has(block)) partial.set(block, { kind: "text", text: "" });
      var cited = partial.get(block);
      cited.citations = (cited.citations || []).concat([frame.citation || {}]);
    } else if (kind === "block") {
      partial.set(block, { kind: frame.content.type || "block", content: frame.content, arguments: "" });
    } else if (kind === "tool_call_cancel" || kind === "block_cancel") {
      partial.delete(block);
    } else if (kind === "stream_reset") {
      partial.clear();
    } else if (kind === "message_committed") {
      var message = frame.message;
      var position = typeof frame.position === "number" ? frame.position : this.messages.length;
      if (position < this.messages.length) {
        // already here (a snapshot read it from the database first): confirmed in its place
        this.messages[position] = message;
      } else {
        if (message.role === "assistant") this.check(message);
        this.messages.push(message);
      }
      partial.clear();
    } else if (kind === "snapshot") {
      this.messages = (frame.messages || []).slice();
      this.partial = new Map();
      var items = frame.partial || [];
      for (var i = 0; i < items.length; i++) this.partial.set(items[i].block, blockFromContent(items[i].content));
      this.status = frame.status;
      this.error = frame.error || null;
    } else if (kind === "run_status") {
      this.status = frame.status;
      this.error = frame.error || null;
    }
  };

  StreamRecoverClient.prototype.check = function (message) {
    var rebuilt = canonical(this.reconstructed());
    var committed = canonical((message.content || []).map(comparable));
    this.stats.checked += 1;
    if (rebuilt !== committed) this.stats.mismatches += 1;
  };

  /* The in-flight blocks in order, as [index, block]. */
  StreamRecoverClient.prototype.partialBlocks = function () {
    return Array.from(this.partial.entries()).sort(function (a, b) { return a[0] - b[0]; });
  };

  /* The in-flight blocks as canonical content (what the committed message should be). */
  StreamRecoverClient.prototype.reconstructed = function () {
    return this.partialBlocks().map(function (entry) { return comparable(blockToContent(entry[1])); });
  };

  /*
   * Watches a thread (ws/streamrecover/threads/<id>/, its owner only): onRun(frame) for the
   * thread's latest run on connect and for every run started in it after, to follow with a
   * StreamRecoverClient. Reopened with the client's backoff until close() or a refusal (4403).
   */
  function StreamRecoverThreadWatch(url, options) {
    options = options || {};
    this.url = url;
    this.onRun = options.onRun || noop;
    this.onError = options.onError || noop;
    this.WebSocketImpl = options.WebSocket || root.WebSocket;
    this.delays = options.delaysMs || DELAYS_MS;
    this.closed = false;
    this.socket = null;
    this.attempt = 0;
    this.timer = null;
    this.lastRunId = null; // the last run announced (on connect: the thread's latest)
  }

  StreamRecoverThreadWatch.prototype.connect = function () {
    var self = this;
    this.closed = false;
    var socket = new this.WebSocketImpl(this.url);
    this.socket = socket;
    socket.onopen = function () {
      if (socket === self.socket) self.attempt = 0;
    };
    socket.onmessage = function (event) {
      if (socket !== self.socket) return;
      var frame = parseFrame(event);
      if (frame === null) return;
      if (frame.type === "run_started") {
        self.lastRunId = frame.run_id;
        self.onRun(frame);
      }
      else if (frame.type === "error") self.onError(frame);
    };
    socket.onclose = function (event) {
      if (socket !== self.socket) return;
      self.socket = null;
      if (self.closed || event.code === FORBIDDEN) return;
      var base = self.delays[Math.min(self.attempt, self.delays.length - 1)];
      self.attempt += 1;
      self.timer = setTimeout(function () {
        self.timer = null;
        if (!self.closed) self.connect();
      }, base * (0.8 + Math.random() * 0.4));
    };
  };

  StreamRecoverThreadWatch.prototype.close = function () {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.socket) this.socket.close(1000);
    this.socket = null;
  };

  StreamRecoverClient.blockToContent = blockToContent;
  StreamRecoverClient.blockFromContent = blockFromContent;
  StreamRecoverClient.canonical = canonical;
  StreamRecoverClient.TERMINAL = TERMINAL;

  StreamRecoverClient.ThreadWatch = StreamRecoverThreadWatch;

  root.StreamRecoverClient = StreamRecoverClient;
  if (typeof module !== "undefined" && module.exports) module.exports = StreamRecoverClient;
})(typeof window !== "undefined" ? window : globalThis);
