// The live page: microphone -> AudioWorklet (PCM at the model's rate) -> WebSocket -> partials
// and finals.
// ?autostart=1 starts at once; ?seconds=N ends the recording after N seconds of audio.
// Each recording's times continue the one before; Save writes the finals as asr transcribe's
// txt and srt files do; each final's cross-attention folds out beneath it.
(() => {
  "use strict";
  const params = new URLSearchParams(location.search);
  const status = document.getElementById("status");
  const toggle = document.getElementById("toggle");
  const finals = document.getElementById("finals");
  const partial = document.getElementById("partial");
  const level = document.getElementById("level");
  const saveTxt = document.getElementById("save-txt");
  const saveSrt = document.getElementById("save-srt");
  let rate;  // the model's, which the server writes into the page: the audio is sent at it
  const cues = [];  // {start, end, text} of every final, in seconds from the first recording
  let recorded = 0;  // seconds of audio the recordings before this one sent
  let session = null;  // the recording in progress
  let latest = null;  // the last one started: only its partial and status are shown

  function say(text, error = false) {
    status.textContent = text;
    status.className = error ? "error" : "";
  }

  function clock(seconds) {  // m:ss.s, rounded before the minutes are split off (1:00.0)
    const tenths = Math.round(seconds * 10);
    const m = Math.floor(tenths / 600);
    return `${m}:${((tenths - 600 * m) / 10).toFixed(1).padStart(4, "0")}`;
  }

  function addFinal(message, offset) {
    const line = document.createElement("div");
    line.className = "final";
    const time = document.createElement("span");
    time.className = "time";
    time.textContent = `${clock(offset + message.start)}–${clock(offset + message.end)}`;
    line.appendChild(time);
    const words = message.words && message.words.length ? message.words : null;
    // A subtitle cue spans the words, as asr.writers.subtitle_cues makes them.
    cues.push(words
      ? { start: offset + words[0].start, end: offset + words[words.length - 1].end, text: message.text }
      : { start: offset + message.start, end: offset + message.end, text: message.text });
    cues[cues.length - 1].recording = offset;  // where its recording starts
    saveTxt.disabled = saveSrt.disabled = false;
    if (words) {
      words.forEach((w, i) => {
        const span = document.createElement("span");
        span.className = "word";
        const sure = w.confidence ?? w.probability;
        if (sure !== undefined && sure < 0.5) span.classList.add("low");
        span.title = `${(offset + w.start).toFixed(2)}–${(offset + w.end).toFixed(2)} s` +
          (sure !== undefined ? `, confidence ${sure.toFixed(2)}` : "");
        span.textContent = (i ? " " : "") + w.word;
        line.appendChild(span);
      });
    } else {
      line.appendChild(document.createTextNode(message.text));
    }
    if (message.alignment) line.appendChild(alignmentView(message.alignment));
    finals.appendChild(line);
  }

  // A final's cross-attention, folded under it: a row per token, a column per encoder frame.
  function alignmentView(a) {
    const [rows, cols] = a.shape;
    const view = document.createElement("details");
    view.className = "alignment";
    const summary = document.createElement("summary");
    const ms = Math.round(1000 * a.frame_seconds);
    summary.textContent = `cross-attention: ${rows} tokens × ${cols} frames of ${ms} ms`;
    const canvas = document.createElement("canvas");
    view.append(summary, canvas);
    const bytes = Uint8Array.from(atob(a.data), (c) => c.charCodeAt(0));
    const label = 40, row = 14, cell = Math.max(1, Math.min(8, Math.floor(640 / Math.max(cols, 1))));
    canvas.width = label + cols * cell;
    canvas.height = rows * row;
    const ctx = canvas.getContext("2d");
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    let sum = 0;
    for (let i = 0; i < rows; i++) {
      ctx.fillStyle = "#5b6478";
      ctx.fillText(String(a.tokens[i] ?? ""), 2, i * row + row / 2, label - 4);
      for (let j = 0; j < cols; j++) {
        const v = bytes[i * cols + j];
        if (!v) continue;
        sum += v;
        ctx.fillStyle = `rgba(31, 78, 140, ${(v / 255).toFixed(3)})`;
        ctx.fillRect(label + j * cell, i * row, cell, row - 1);
      }
    }
    canvas.dataset.checksum = String(sum);  // what a test compares with the message's bytes
    return view;
  }

  function millis(seconds) {  // as Python's round(): a tie goes to the even number
    const exact = seconds * 1000;
    const near = Math.round(exact);
    return near - exact === 0.5 && near % 2 ? near - 1 : near;
  }

  function stamp(seconds) {  // SubRip's HH:MM:SS,mmm
    const ms = millis(Math.max(seconds, 0));
    const pad = (n, width) => String(n).padStart(width, "0");
    return `${pad(Math.floor(ms / 3600000), 2)}:${pad(Math.floor(ms / 60000) % 60, 2)}:` +
      `${pad(Math.floor(ms / 1000) % 60, 2)},${pad(ms % 1000, 3)}`;
  }

  function srt(list) {  // as asr.writers.to_srt: SubRip has no escapes, and "-->" is a timing
    return list.map((c, i) => `${i + 1}\n${stamp(c.start)} --> ${stamp(c.end)}\n` +
      `${c.text.replace(/-{2,}>/g, "->")}\n\n`).join("");
  }

  function save(name, text) {
    const link = document.createElement("a");
    link.href = URL.createObjectURL(new Blob([text], { type: "text/plain;charset=utf-8" }));
    link.download = name;
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  }

  function ordered() {
    return [...cues].sort((a, b) => a.start - b.start);
  }

  // As asr.writers._lasting writes a recording's files: players skip a cue that ends as it
  // starts (a final the timing gave no frames), so it joins the next cue of its recording, the
  // last one the cue before it; an only one is shown for LONE_CUE_SECONDS within [from, to].
  const LONE_CUE_SECONDS = 0.5;
  function lasting(list, from, to) {
    const kept = [];
    let waiting = null;
    for (const cue of list) {
      let { start, text } = cue;
      if (waiting) [start, text, waiting] = [waiting.start, `${waiting.text} ${text}`, null];
      if (millis(cue.end) <= millis(start)) waiting = { start, text };
      else kept.push({ start, end: cue.end, text });
    }
    if (waiting && kept.length) {
      const last = kept.pop();
      kept.push({ start: last.start, end: Math.max(last.end, waiting.start),
        text: `${last.text} ${waiting.text}` });
    } else if (waiting) {
      const start = Math.min(waiting.start, Math.max(to - LONE_CUE_SECONDS, from));
      const end = to > start ? Math.min(start + LONE_CUE_SECONDS, to) : start;  // within the audio
      kept.push({ start, end: Math.max(end, start + 0.001), text: waiting.text });
    }
    return kept;
  }

  saveTxt.addEventListener("click", () =>
    save("transcript.txt", ordered().map((c) => c.text).join(" ") + "\n"));
  saveSrt.addEventListener("click", () => {
    const heard = session ? session.offset + session.sent / rate : recorded;
    const starts = [...new Set(cues.map((c) => c.recording))].sort((a, b) => a - b);
    const kept = starts.flatMap((from, k) => lasting(
      ordered().filter((c) => c.recording === from), from, starts[k + 1] ?? heard));
    save("transcript.srt", srt(kept));
  });

  async function start() {
    // Held from the first await: a second click (or one while the browser asks for the
    // microphone) starts nothing; Stop before the socket opens ends this start.
    const s = { sent: 0, ended: false, offset: recorded, said: false };
    session = latest = s;
    partial.textContent = "";  // the last recording's unfinished words are not this one's
    toggle.textContent = "Stop";
    toggle.classList.add("recording");
    try {
      s.media = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
      });
      if (s.ended) return finish(s);
      s.context = new AudioContext();
      try {
        await s.context.audioWorklet.addModule("worklet.js");  // relative: under a proxy's prefix too
      } catch {  // the browser's own words name a script, not the cause
        throw new Error("the server does not answer: is asr serve running?");
      }
      if (s.ended) return finish(s);
      listen(s);
    } catch (err) {
      finish(s);
      throw err;
    }
  }

  function listen(s) {
    const source = s.context.createMediaStreamSource(s.media);
    const node = new AudioWorkletNode(s.context, "pcm-resampler", {
      processorOptions: { targetRate: rate, packetMs: 100 },
    });
    // The socket opens after the audio is set up, with its handlers attached at once.
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}${location.pathname}`);  // this page's address
    ws.binaryType = "arraybuffer";
    s.ws = ws;
    const current = () => session === s;  // a later recording's status is not this one's
    const shown = () => latest === s;  // stopped, it still shows its last words until a new one
    const limit = Number(params.get("seconds") || 0);
    const send = (packet) => {
      const pcm = new Int16Array(packet);
      let peak = 0;
      for (let i = 0; i < pcm.length; i += 8) peak = Math.max(peak, Math.abs(pcm[i]));
      level.style.width = `${Math.min(100, (100 * peak) / 16384)}%`;
      ws.send(packet);
      s.sent += pcm.length;
      if (limit && s.sent >= limit * rate) stop();
    };
    // What the microphone gives while the socket opens waits for the server's ready: the
    // button says Stop from the click, so the first words are spoken then.
    s.early = [];
    node.port.onmessage = (event) => {
      if (s.ended) return;
      if (!s.ready) s.early.push(event.data);
      else if (ws.readyState === WebSocket.OPEN) send(event.data);
    };
    source.connect(node);
    ws.onopen = () => {
      if (s.ended) ws.close();  // stopped while connecting: no stream to start
      else ws.send(JSON.stringify({ type: "start", sample_rate: rate, format: "s16le", alignment: true }));
    };
    ws.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "ready") {
        s.ready = true;
        for (const packet of s.early.splice(0)) if (!s.ended) send(packet);
        const first = message.first_chunk_ms !== message.chunk_ms
          ? `, each utterance's first ${message.first_chunk_ms} ms` : "";
        if (current()) say(message.chunk_ms === null ? "Listening (full context: finals only)…"
          : `Listening (chunks of ${message.chunk_ms} ms${first})…`);
      } else if (message.type === "partial") {
        if (shown()) partial.textContent = message.text;
      } else if (message.type === "final") {
        if (shown()) partial.textContent = "";
        addFinal(message, s.offset);
      } else if (message.type === "done") {
        s.said = true;
        if (shown()) {
          partial.textContent = "";
          document.body.dataset.done = message.text;
          say(`Done: ${clock(message.duration)} of audio.`);
        }
      } else if (message.type === "error") {
        s.said = true;
        if (shown()) {  // the stream ends here: its partial gets no final
          partial.textContent = "";
          say(`Error: ${message.message}`, true);
        }
        // a server started again with another model since this page loaded: its rate is stale
        fetch("health").then((r) => r.json()).then((health) => {
          if (health.sample_rate && health.sample_rate !== rate && shown()) {
            say(`The server's model takes ${health.sample_rate} Hz since this page loaded: reload the page.`, true);
          }
        }).catch(() => {});
      }
    };
    // a refused origin (403) looks like an unreachable server to the page: both are said
    const why = "Cannot open the socket: is the server running? A page at a host name or behind "
      + "a proxy needs asr serve --allow-origin.";
    ws.onerror = () => { if (current() && !s.ready) say(why, true); };
    ws.onclose = (event) => {
      if (event.code === 1001) {
        if (shown()) say("The server stopped; the finals of what it heard are above.", true);
      } else if (!s.said && s.ready && shown()) {  // 1006: the server went away without a word
        say(`Connection to the server lost (${event.code}): the last utterance got no final.`, true);
        partial.textContent = "";
      }
      if (current()) finish(s);
    };
  }

  function finish(s) {  // again for a start stopped halfway: what it got since is released
    s.ended = true;
    recorded = s.offset + s.sent / rate;
    if (s.media) s.media.getTracks().forEach((t) => t.stop());
    if (s.context && !s.closed) s.context.close();
    s.closed = Boolean(s.context);
    if (session === s) {
      toggle.textContent = "Start";
      toggle.classList.remove("recording");
      level.style.width = "0";
      session = null;
    }
  }

  function stop() {
    const s = session;
    if (!s) return;
    // Still connecting: its onopen closes it.
    if (s.ws && s.ws.readyState === WebSocket.OPEN) s.ws.send(JSON.stringify({ type: "end" }));
    finish(s);
  }

  if (location.protocol === "file:") {  // the recognition, and the audio worklet, are the server's
    say("Open this page at asr serve's address (http://127.0.0.1:8765/ by default), not as a file.", true);
    toggle.disabled = true;
    return;
  }
  rate = JSON.parse(document.getElementById("model").textContent).sample_rate;
  // Without a secure context (http from another machine) the browser hides the microphone.
  if (!window.isSecureContext || !navigator.mediaDevices) {
    say("This browser gives the microphone only to https pages and to localhost: start " +
      "asr serve with --certfile (and --keyfile), or open this page through ssh -L " +
      `${location.port || 80}:localhost:${location.port || 80}.`, true);
    toggle.disabled = true;
    return;
  }
  toggle.addEventListener("click", () => {
    if (session) stop();
    else start().catch((err) => say(`Cannot start: ${err.message}`, true));
  });
  if (params.get("autostart")) start().catch((err) => say(`Cannot start: ${err.message}`, true));
})();
